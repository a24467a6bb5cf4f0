"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: inf/nan on rank 1 only.

argv: OUT_DIR SYNC (1 = agree on found_inf where the ranks' flags can differ, 0 = never). Each
scenario runs twice, with loss scaling on (in fp16_emulation) and off (the scaler's
skip_nonfinite guard), and counts the package's collectives (``paddle.distributed``'s
all_reduce, which DataParallel's own reducer does not call) inside ``scaler.step``:

- ``batch``: a NaN in rank 1's batch at step 1; ``paddle.DataParallel`` all-reduces it into every
  rank's gradients, so every rank already sees it;
- ``no_sync``: the second Linear's parameters are marked ``no_sync`` (as MoE experts are) and
  it is outside ``paddle.DataParallel`` (Paddle 2.6.2's DataParallel fails on ``no_sync``
  parameters inside it: "tensors len must be equal to is_sparse_gradient len"), so their
  gradients stay rank-local; an inf appears in rank 1's at step 1.

Writes OUT_DIR/rank{N}.json.
"""

import json
import sys
from contextlib import nullcontext

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp
from paddle_amp_ext import _compat

out_dir, sync = sys.argv[1], sys.argv[2] == "1"
dist.init_parallel_env()
rank = dist.get_rank()
calls = {"n": 0}
_all_reduce = paddle.distributed.all_reduce


def counted_all_reduce(*args, **kwargs):
    calls["n"] += 1
    return _all_reduce(*args, **kwargs)


paddle.distributed.all_reduce = counted_all_reduce


def run(scaling: bool, scenario: str) -> dict:
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
    if scenario == "no_sync":
        for p in model[2].parameters():
            p.no_sync = True
        body = paddle.DataParallel(model[:2])

        def dp(x):
            return model[2](body(x))
    else:
        dp = paddle.DataParallel(model)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = amp.GradScaler(enable=scaling, init_loss_scaling=1024.0, sync_found_inf=sync)
    rng = np.random.default_rng(rank)
    skipped, collectives = [], []
    with amp.fp16_emulation(model, custom_black_list=["matmul"]) if scaling else nullcontext():
        for step in range(3):
            x = rng.standard_normal((8, 4)).astype("float32")
            if scenario == "batch" and step == 1 and rank == 1:
                x[0, 0] = np.nan
            loss = dp(paddle.to_tensor(x)).pow(2).mean()
            scaler.scale(loss).backward()  # DataParallel all-reduces the synced gradients here
            if scenario == "no_sync" and step == 1 and rank == 1:  # a rank-local gradient goes inf
                with paddle.no_grad():
                    _compat.grad_of(model[2].weight).multiply_(paddle.to_tensor(float("inf")))
            before = calls["n"]
            skipped.append(scaler.step(opt).skipped)
            collectives.append(calls["n"] - before)
            scaler.update()
            opt.clear_grad()
    return {"skipped": skipped, "scale": scaler.loss_scale, "collectives": collectives,
            "params": [p.numpy().ravel().tolist() for p in model.parameters()]}


record = {f"{scenario}_{mode}": run(mode == "on", scenario)
          for scenario in ("batch", "no_sync") for mode in ("on", "off")}
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(record, f)
