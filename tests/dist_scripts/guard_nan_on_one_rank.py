"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: NaN on rank 1 only.

fleet's data parallel (HybridParallelOptimizer) with the optimizer guarded and no scaler, as a
Trainer's bf16 path runs it: steps 0-1 through ``optimizer.step()``, steps 2-3 through
``optimizer._step(parameters)`` as the Trainers call it. A NaN appears on rank 1 after the
gradient all-reduce at steps 1 and 3. argv: OUT_DIR. Writes OUT_DIR/rank{N}.json.
"""

import json
import sys

import protobuf_for_fleet  # noqa: F401  (first: before paddle)

# isort: split
import numpy as np
import paddle
from paddle.distributed import fleet

import paddle_amp_ext as amp
from paddle_amp_ext import _compat

fleet.init(is_collective=True)
rank = paddle.distributed.get_rank()
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
dp = fleet.distributed_model(model)
opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters()))
guard = amp.guard_optimizer(opt)
skipped = []
rng = np.random.default_rng(rank)
for step in range(4):
    x = paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))
    dp(x).pow(2).mean().backward()  # the gradients are all-reduced here
    if step in (1, 3) and rank == 1:
        with paddle.no_grad():
            _compat.grad_of(model[0].weight).multiply_(paddle.to_tensor(float("nan")))
    if step < 2:
        opt.step()
    else:
        opt._step(list(model.parameters()))
    skipped.append(guard.last_step_skipped)
    opt.clear_grad()
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump({"method": guard._name, "skipped": skipped, "skipped_steps": guard.skipped_steps,
               "params": [p.numpy().ravel().tolist() for p in model.parameters()]}, f)
