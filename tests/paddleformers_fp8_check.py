"""PaddleFormers' FP8 layers (fp8_utils.FP8Linear, FP8Mlp) trained on a CPU under fp8_emulation.

Run by tests/test_fp8_paddleformers.py with the PaddleFormers venv's Python; prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import paddle
from paddleformers.transformers import fp8_utils

from paddle_amp_ext import fp8_emulation
from paddle_amp_ext.fp8 import kernels

paddle.seed(0)
result = {"deep_gemm_before": hasattr(fp8_utils, "deep_gemm")}

# FP8Linear: forward equals the blockwise recipe computed independently from the same bf16 tensors
lin = fp8_utils.FP8Linear(256, 384)
x = (paddle.randn([2, 64, 256]) * 3).astype("bfloat16")
x.stop_gradient = False
with fp8_emulation():
    y = lin(x)
    y.astype("float32").sum().backward()
xs = kernels.to_numpy(x).reshape(-1, 256)
w = kernels.to_numpy(lin.weight)
qx, sx = kernels.quant_blocks(xs, one_by_128=True)
qw, sw = kernels.quant_blocks(w.T, one_by_128=False)
expect = paddle.to_tensor(kernels.blockwise_matmul(qx, sx.T, qw, sw, True, False)).astype("bfloat16")
result["linear_forward_equal"] = bool(np.array_equal(kernels.to_numpy(y).reshape(-1, 384), kernels.to_numpy(expect)))
result["linear_grad_shapes"] = [list(x.grad.shape), list(lin.weight.grad.shape), str(lin.weight.grad.dtype)]
result["deep_gemm_after"] = hasattr(fp8_utils, "deep_gemm")

# FP8Mlp (DeepSeek-V3's MLP: gate_up, swiglu, down; all GEMMs in FP8) trains next to its float32 twin
cfg = SimpleNamespace(hidden_size=256, intermediate_size=256)
mlp = fp8_utils.FP8Mlp(cfg)
w1, w2 = kernels.to_numpy(mlp.w1), kernels.to_numpy(mlp.w2)
ref_w1, ref_w2 = paddle.to_tensor(w1, stop_gradient=False), paddle.to_tensor(w2, stop_gradient=False)
inputs = paddle.randn([1, 128, 256])
target = paddle.randn([1, 128, 256]) * 0.1
losses, ref_losses = [], []
lr = 20.0
for _ in range(4):
    xin = inputs.astype("bfloat16")
    xin.stop_gradient = False  # FP8MlpFunction's backward returns dx
    with fp8_emulation():
        out = mlp(xin)
        loss = ((out.astype("float32") - target) ** 2).mean()
        loss.backward()
    losses.append(float(loss))
    for p in (mlp.w1, mlp.w2):
        grad = p.main_grad if getattr(p, "main_grad", None) is not None else p.grad
        with paddle.no_grad():
            p.set_value((p.astype("float32") - lr * grad.astype("float32")).astype("bfloat16"))
        p.main_grad = None
        p.clear_gradient()
    h = paddle.matmul(inputs.reshape([-1, 256]), ref_w1)
    a, b = paddle.chunk(h, 2, axis=-1)
    ref = paddle.matmul(paddle.nn.functional.silu(a) * b, ref_w2).reshape([1, 128, 256])
    ref_loss = ((ref - target) ** 2).mean()
    ref_loss.backward()
    ref_losses.append(float(ref_loss))
    with paddle.no_grad():
        for p in (ref_w1, ref_w2):
            p.set_value(p - lr * p.grad)
            p.clear_gradient()
result["mlp_losses"] = losses
result["mlp_ref_losses"] = ref_losses
print(json.dumps(result))
sys.exit(0)
