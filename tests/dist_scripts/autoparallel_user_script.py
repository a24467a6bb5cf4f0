"""An unmodified auto-parallel training script (``paddle.amp`` only), for ``paddle_amp_ext.run``.

argv: OUT_DIR. A default process group (``dist.init_parallel_env()``), a column-sharded MLP
(``dist.shard_layer``), ``dist.shard_optimizer`` with Paddle's ``ClipGradByGlobalNorm``,
``paddle.amp.GradScaler`` (wrapped by ``dist.shard_scaler`` where it exists), NaN in rank 1's
shard of the first layer's output at step 1. Writes OUT_DIR/rank{N}.json.
"""

import json
import sys

import numpy as np
import paddle
import paddle.distributed as dist

out_dir = sys.argv[1]
dist.init_parallel_env()
rank = dist.get_rank()
mesh = dist.ProcessMesh([0, 1], dim_names=["x"])


def shard_fn(name, layer, mesh):
    if name == "0":
        layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(1)])
        layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Shard(0)])


paddle.seed(0)
model = dist.shard_layer(paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2)),
                         mesh, shard_fn)
opt = dist.shard_optimizer(paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters(),
                                                grad_clip=paddle.nn.ClipGradByGlobalNorm(0.05)))
scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
if hasattr(dist, "shard_scaler"):
    scaler = dist.shard_scaler(scaler)
nan = dist.shard_tensor(paddle.to_tensor(float("nan") if rank == 1 else 1.0), mesh, [dist.Replicate()])
found = []
for step in range(3):
    x = dist.shard_tensor(paddle.to_tensor(np.random.default_rng(step).standard_normal((4, 4)).astype("float32")),
                          mesh, [dist.Replicate()])
    handle = model[0].register_forward_post_hook(lambda layer, inputs, out: out * nan) if step == 1 else None
    with paddle.amp.auto_cast():
        loss = model(x).pow(2).mean()
    if handle is not None:
        handle.remove()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    found.append(bool(getattr(scaler, "_cache_found_inf", None)))
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"scaler": type(scaler).__module__, "found": found, "scale": scaler._scale.numpy().tolist(),
               "params": [np.asarray(p.numpy()).ravel().tolist() for p in model.parameters()]}, f)
