"""Run under `paddle.distributed.launch --nproc_per_node 2` (Paddle 3.x): training steps under ``dist.enable_auto_dp()``.

argv: OUT_DIR [VARIANTS, comma-separated]. An MLP replicated with ``dist.shard_layer`` (no shard
function), its optimizer wrapped by ``dist.shard_optimizer``, auto-dp on (as PaddleFormers'
``Trainer(enable_auto_parallel=True)`` does): each rank feeds its own dense batch, so each rank's
gradient is its own addend, labelled ``Replicate`` until the optimizer's step relabels it
``Partial``. At step 1 rank 1's first-layer output is NaN (rank 1's gradient only). Variants:

- ``paddle`` / ``paddle_clip``: Paddle's own path (no clip / ``ClipGradByGlobalNorm(CLIP)`` on the
  optimizer) on the batches of steps 0 and 2, the reference;
- ``off``, ``off_clip``, ``own_clip``: ``GradScaler(enable=False)`` (loss scaling off, the
  non-finite guard), ``step()`` with no clip, ``grad_clip=CLIP``, the optimizer's own clip;
- ``emulate``, ``emulate_clip``: loss scaling on inside ``fp16_emulation`` (scale 1024);
- ``guard``, ``guard_clip``: ``guard_optimizer`` on a plain loop (no clip / the optimizer's clip);
- ``shard_scaler``, ``emulate_shard_scaler``: the scaler wrapped by ``dist.shard_scaler``.

Writes OUT_DIR/rank{N}.json: per variant the skips, the scales, the final parameters and the
relative error against Paddle's path.
"""

from __future__ import annotations

import contextlib
import json
import sys

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp

CLIP = 0.05
out_dir = sys.argv[1]
dist.enable_auto_dp()
dist.init_parallel_env()
rank = dist.get_rank()
MESH = dist.ProcessMesh([0, 1], dim_names=["dp"])
ALL = ("paddle", "paddle_clip", "off", "off_clip", "own_clip", "emulate", "emulate_clip", "guard", "guard_clip",
       "shard_scaler", "emulate_shard_scaler")


def build(clip: bool):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))
    model = dist.shard_layer(model, MESH)
    opt = paddle.optimizer.SGD(0.5, parameters=model.parameters(),
                               grad_clip=paddle.nn.ClipGradByGlobalNorm(CLIP) if clip else None)
    return model, dist.shard_optimizer(opt)


def loss_of(model, step: int, nan: bool):
    """This rank's own batch; at step 1 (``nan``) rank 1's first-layer output is NaN."""
    x = paddle.to_tensor(np.random.default_rng(10 * step + rank).standard_normal((2, 4)).astype("float32"))
    handle = None
    if nan and step == 1 and rank == 1:
        handle = model[0].register_forward_post_hook(lambda layer, inputs, out: out * float("nan"))
    loss = model(x).pow(2).mean()
    if handle is not None:
        handle.remove()
    return loss


def params(model) -> list:
    return [np.asarray(p._local_value().numpy()).ravel().tolist() for p in model.parameters()]


def run_paddle(clip: bool) -> dict:
    model, opt = build(clip)
    for step in (0, 2):
        loss_of(model, step, nan=False).backward()
        opt.step()
        opt.clear_grad()
    return {"params": params(model)}


def run_scaler(variant: str) -> dict:
    emulate = variant.startswith("emulate")
    own_clip = variant == "own_clip"
    model, opt = build(own_clip)
    scaler = amp.GradScaler(init_loss_scaling=1024.0) if emulate else amp.GradScaler(enable=False)
    if variant.endswith("shard_scaler"):
        scaler = dist.shard_scaler(scaler)
    grad_clip = CLIP if variant in ("off_clip", "emulate_clip") else None
    rec: dict = {"skipped": [], "scales": []}
    context = amp.fp16_emulation(model, custom_black_list=["matmul"]) if emulate else contextlib.nullcontext()
    with context:
        for step in range(3):
            scaler.scale(loss_of(model, step, nan=True)).backward()
            result = scaler.step(opt, grad_clip=grad_clip)
            scaler.update()
            opt.clear_grad()
            rec["skipped"].append(result.skipped)
            rec["scales"].append(scaler.loss_scale)
    rec["params"] = params(model)
    return rec


def run_guard(variant: str) -> dict:
    model, opt = build(variant == "guard_clip")
    rec: dict = {"skipped": [], "scales": []}
    with amp.guard_optimizer(opt) as guard:
        for step in range(3):
            loss_of(model, step, nan=True).backward()
            opt.step()
            opt.clear_grad()
            rec["skipped"].append(guard.last_step_skipped)
            rec["scales"].append(1.0)
    rec["params"] = params(model)
    return rec


def rel_error(ours: list, ref: list) -> float:
    a, b = np.concatenate([np.ravel(p) for p in ours]), np.concatenate([np.ravel(p) for p in ref])
    return float(np.abs(a - b).max() / np.abs(b).max())


variants = sys.argv[2].split(",") if len(sys.argv) > 2 else list(ALL)
record: dict = {"paddle": run_paddle(False), "paddle_clip": run_paddle(True)}
for name in variants:
    if name.startswith("paddle"):
        continue
    rec = run_guard(name) if name.startswith("guard") else run_scaler(name)
    clipped = name in ("off_clip", "own_clip", "emulate_clip", "guard_clip")
    rec["rel"] = rel_error(rec["params"], record["paddle_clip" if clipped else "paddle"]["params"])
    print(f"rank {rank} {name}: skipped {rec['skipped']} scales {rec['scales']} rel {rec['rel']:.3g}", flush=True)
    record[name] = rec
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(record, f)
