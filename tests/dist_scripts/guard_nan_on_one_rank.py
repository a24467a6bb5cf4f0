"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: NaN on rank 1 only.

Part 1, fleet's data parallel (HybridParallelOptimizer) with the optimizer guarded and no
scaler, as a Trainer's bf16 path runs it: steps 0-1 through ``optimizer.step()``, steps 2-3
through ``optimizer._step(parameters)`` as the Trainers call it.
Part 2, fp32 master gradients (MixPrecisionLayer/MixPrecisionOptimizer, gradients all-reduced by
fleet's ``fused_allreduce_gradients`` as the Trainers do with ``amp_master_grad``): steps 0-3
with this package's scaler on (inside fp16_emulation), steps 4-7 with the optimizer guarded.
A NaN appears on rank 1 before the gradient all-reduce at every odd step (in its loss, or its
master gradient), so the all-reduce carries it to every rank: every rank skips with no
collective of the package's (``paddle.distributed.all_reduce`` calls inside the step are
counted; fleet's gradient all-reduce is outside it).
argv: OUT_DIR. Writes OUT_DIR/rank{N}.json.
"""

import json
import sys

import protobuf_for_fleet  # noqa: F401  (first: before paddle)

# isort: split
import numpy as np
import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.utils import mix_precision_utils as mpu
from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients

import paddle_amp_ext as amp
from paddle_amp_ext import _compat


def make_model():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))


def poison_on_rank_1(step, param):
    if step % 2 == 1 and rank == 1:
        with paddle.no_grad():
            _compat.grad_of(param).multiply_(paddle.to_tensor(float("nan")))


def poisoned_loss(step, loss):
    return loss * float("nan") if step % 2 == 1 and rank == 1 else loss


calls = {"n": 0}
_all_reduce = paddle.distributed.all_reduce


def counted_all_reduce(*args, **kwargs):
    calls["n"] += 1
    return _all_reduce(*args, **kwargs)


def counting(fn, *args, **kwargs):
    """fn(*args, **kwargs) and the paddle.distributed.all_reduce calls it made."""
    paddle.distributed.all_reduce = counted_all_reduce
    try:
        before = calls["n"]
        result = fn(*args, **kwargs)
        return result, calls["n"] - before
    finally:
        paddle.distributed.all_reduce = _all_reduce


fleet.init(is_collective=True)
rank = paddle.distributed.get_rank()
rng = np.random.default_rng(rank)
out = {}

# Part 1: fleet's data parallel, guarded, no scaler.
model = make_model()
dp = fleet.distributed_model(model)
opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters()))
guard = amp.guard_optimizer(opt)
skipped, collectives = [], []
for step in range(4):
    x = paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))
    poisoned_loss(step, dp(x).pow(2).mean()).backward()  # the gradients are all-reduced here
    if step < 2:
        _, n = counting(opt.step)
    else:
        _, n = counting(opt._step, list(model.parameters()))
    skipped.append(guard.last_step_skipped)
    collectives.append(n)
    opt.clear_grad()
out["fleet"] = {"method": guard._name, "skipped": skipped, "skipped_steps": guard.skipped_steps,
                "collectives": collectives, "params": [p.numpy().ravel().tolist() for p in model.parameters()]}

# Part 2: master gradients, the scaler on, then the guard.
inner = make_model()
wrapped = mpu.MixPrecisionLayer(inner, dtype="float16")
opt = mpu.MixPrecisionOptimizer(paddle.optimizer.AdamW(learning_rate=0.1, parameters=inner.parameters()))
scaler = amp.GradScaler(init_loss_scaling=1024.0)
skipped, scales, collectives = [], [], []
with amp.fp16_emulation(wrapped, custom_black_list=["matmul"]):
    for step in range(4):
        x = paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))
        scaler.scale(wrapped(x).pow(2).mean()).backward()
        poison_on_rank_1(step, inner[0].weight)
        fused_allreduce_gradients(list(inner.parameters()), None)
        result, n = counting(scaler.step, opt, grad_clip=1.0)
        skipped.append(result.skipped)
        collectives.append(n)
        scaler.update()
        scales.append(scaler.loss_scale)
        opt.clear_grad()
guard = amp.guard_optimizer(opt)
for step in range(4, 8):
    x = paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))
    wrapped(x).pow(2).mean().backward()
    poison_on_rank_1(step, inner[0].weight)
    fused_allreduce_gradients(list(inner.parameters()), None)
    collectives.append(counting(opt.step)[1])
    skipped.append(guard.last_step_skipped)
    opt.clear_grad()
out["master_grad"] = {"skipped": skipped, "scales": scales, "guard_skipped_steps": guard.skipped_steps,
                      "collectives": collectives,
                      "params": [p.numpy().ravel().tolist() for p in inner.parameters()]}
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(out, f)
