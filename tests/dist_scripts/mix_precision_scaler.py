"""One process with fleet.init: fleet's MixPrecisionScaler over this package's scaler.

Built as PaddleNLP's and PaddleFormers' Trainers build it with ``amp_master_grad``
(MixPrecisionLayer, MixPrecisionOptimizer, ``MixPrecisionScaler(scaler)`` whose return value
they drop), compared with a plain float32 control. argv: OUT_JSON.
"""

import json
import sys

import protobuf_for_fleet  # noqa: F401  (first: before paddle)

# isort: split
import numpy as np
import paddle
from paddle.distributed import fleet
from paddle.distributed.fleet.utils import mix_precision_utils as mpu

import paddle_amp_ext as amp

fleet.init(is_collective=True)
paddle.seed(0)
inner = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
paddle.seed(0)
control = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
model = mpu.MixPrecisionLayer(inner, dtype="float16")
opt = mpu.MixPrecisionOptimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=inner.parameters()))
opt_c = paddle.optimizer.SGD(learning_rate=0.1, parameters=control.parameters())
scaler = amp.GradScaler(init_loss_scaling=1024.0)
wrapped = mpu.MixPrecisionScaler(scaler)  # replaces scaler._unscale
rng = np.random.default_rng(0)
out = {"found_inf_types": [], "skipped": [], "scales": [], "grads_equal_control": [], "params_equal_control": [],
       "optimizer_was_run": []}
with amp.fp16_emulation(model, custom_black_list=["matmul"]):
    for step, poison in enumerate((None, "inf", None, "nan")):
        use = wrapped if step % 2 == 0 else scaler  # through the wrapper, and as the Trainers do
        x = paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))
        loss = model(x).pow(2).mean()
        use.scale(loss * float(poison) if poison else loss).backward()
        if poison is None:
            use.unscale_(opt)
            control(x).pow(2).mean().backward()
            out["grads_equal_control"].append(all(
                np.array_equal(p.main_grad.numpy(), c.grad.numpy())
                for p, c in zip(inner.parameters(), control.parameters())))
            opt_c.step()
            opt_c.clear_grad()
        result = use.step(opt)
        out["found_inf_types"].append(type(scaler._found_inf).__name__)
        use.update()
        out["optimizer_was_run"].append(not scaler._cache_found_inf)
        opt.clear_grad()
        out["skipped"].append(result.skipped)
        out["scales"].append(result.loss_scale)
        out["params_equal_control"].append(all(
            np.array_equal(p.numpy(), c.numpy()) for p, c in zip(inner.parameters(), control.parameters())))
out["skipped_steps"] = scaler.skipped_steps
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
