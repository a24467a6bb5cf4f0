"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: inf on rank 1 only.

argv: OUT_DIR SYNC (1 = agree on found_inf, 0 = do not). Runs twice, with loss scaling on (in
fp16_emulation) and off (the scaler's skip_nonfinite guard). Writes OUT_DIR/rank{N}.json.
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


def run(scaling: bool) -> dict:
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
    dp = paddle.DataParallel(model)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = amp.GradScaler(enable=scaling, init_loss_scaling=1024.0, sync_found_inf=sync)
    rng = np.random.default_rng(rank)
    skipped = []
    with amp.fp16_emulation(model, custom_black_list=["matmul"]) if scaling else nullcontext():
        for step in range(3):
            x = paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))
            loss = dp(x).pow(2).mean()
            scaler.scale(loss).backward()  # DataParallel all-reduces the gradients here
            if step == 1 and rank == 1:  # an inf that appears after the all-reduce, on one rank
                grad = _compat.grad_of(model[0].weight)
                with paddle.no_grad():
                    grad.multiply_(paddle.to_tensor(float("inf")))
            skipped.append(scaler.step(opt).skipped)
            scaler.update()
            opt.clear_grad()
    return {"skipped": skipped, "scale": scaler.loss_scale,
            "params": [p.numpy().ravel().tolist() for p in model.parameters()]}


with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"on": run(scaling=True), "off": run(scaling=False)}, f)
