"""Unscale on an overflow step, as Paddle's CUDA kernel computes it (not the CPU kernel's zeros).

Paddle's CPU ``check_finite_and_unscale`` multiplies by 0 the first tensor holding inf/nan and
every tensor after it; the CUDA kernel (paddle/phi/kernels/gpu/amp_kernel.cu, read) multiplies
every element by ``1 / scale`` and sets found_inf. The rehearsal (and any unscale this package's
scaler makes on a CPU) follows the CUDA kernel: what a user logs, clips or inspects on such a
step is what the GPU leaves. The reference is computed independently, in numpy, from the scaled
gradients the backward produced.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import make_mlp
from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionLayer, MixPrecisionOptimizer

import paddle_amp_ext as amp
from paddle_amp_ext._compat import scaler as compat_scaler
from paddle_amp_ext.distributed import host_bool

INF = float("inf")


def tensors(*rows, dtype="float32"):
    return [paddle.to_tensor(np.array(r, dtype=dtype)) for r in rows]


def test_every_tensor_is_scaled_and_found_inf_set():
    grads = tensors([2, 4], [INF, 4], [6, 8])
    found = compat_scaler.unscale_as_cuda(grads, paddle.to_tensor([2.0]))
    assert host_bool(found) is True and found.shape == [1] and found.dtype == paddle.bool
    assert [g.numpy().tolist() for g in grads] == [[1, 2], [INF, 2], [3, 4]]


def test_the_cpu_kernel_is_what_differs_the_premise():
    """Paddle's CPU kernel (the one the GPU path of this package calls) zeroes from the inf on."""
    scaler = amp.GradScaler()
    grads = tensors([2, 4], [INF, 4], [6, 8])
    scaler._scale = paddle.to_tensor([2.0])
    found = compat_scaler._check_finite_and_unscale(scaler, grads)
    out = [g.numpy().tolist() for g in grads]
    assert host_bool(found) is True
    assert out[0] == [1, 2] and np.isnan(out[1][0]) and out[1][1] == 0 and out[2] == [0, 0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_low_and_high_precision_gradients(dtype):
    """float16/bfloat16: the product in float32, rounded to the gradient's dtype (the kernel's MT)."""
    rows = ([3.0, 1000.0], [np.nan, 5.0], [7.0, -9.0])
    grads = [paddle.to_tensor(np.array(r, dtype="float32")).astype(dtype) for r in rows]
    scale = 3.0  # 1/3 is inexact: the rounding order shows
    found = compat_scaler.unscale_as_cuda(grads, paddle.to_tensor([scale]))
    inverse = np.float32(1) / np.float32(scale)
    for grad, row in zip(grads, rows):
        source = np.array(row, dtype="float32")
        if dtype == "float64":
            expected = source.astype(np.float64) * (1.0 / np.float64(np.float32(scale)))
        else:
            source = paddle.to_tensor(source).astype(dtype).astype("float32").numpy()
            expected = paddle.to_tensor(source * inverse).astype(dtype).astype("float32").numpy()
        assert grad.dtype == getattr(paddle, dtype)
        np.testing.assert_array_equal(grad.astype("float64").numpy(), expected.astype(np.float64))
    assert host_bool(found) is True


def test_a_finite_step_is_found_finite_and_nothing_else_changes():
    grads = tensors([2, 4], [-6, 8])
    found = compat_scaler.unscale_as_cuda(grads, paddle.to_tensor([4.0]))
    assert host_bool(found) is False
    assert [g.numpy().tolist() for g in grads] == [[0.5, 1], [-1.5, 2]]
    assert host_bool(compat_scaler.unscale_as_cuda([], paddle.to_tensor([4.0]))) is False


def test_a_scale_below_one_that_overflows_the_unscaled_value_is_found():
    """The CUDA kernel tests the unscaled value: finite * (1/scale) can overflow to inf."""
    grads = tensors([3e38, 1.0])
    found = compat_scaler.unscale_as_cuda(grads, paddle.to_tensor([0.5]))
    assert host_bool(found) is True and grads[0].numpy().tolist() == [INF, 2.0]


def overflowing_data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype("float32")
    x[3, 2], x[17, 5] = 9e4, -1.2e5  # a few inputs that overflow float16
    return paddle.to_tensor(x), paddle.to_tensor(rng.standard_normal((32, 1)).astype("float32"))


def scaled_then_unscaled(master: bool):
    """(scaled gradients copied after backward, the same after scaler.unscale_, scale, found)."""
    x, y = overflowing_data()
    inner = make_mlp(seed=3)
    model = MixPrecisionLayer(inner, dtype="float16") if master else inner
    sgd = paddle.optimizer.SGD(learning_rate=0.1, parameters=inner.parameters())
    opt = MixPrecisionOptimizer(sgd) if master else sgd
    scaler = amp.GradScaler(init_loss_scaling=2.0**10)

    def grads():
        return [(p.main_grad if master else p.grad).numpy().copy() for p in inner.parameters()]

    with amp.fp16_emulation(model):
        scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
        scaled = grads()
        scaler.unscale_(opt)
        unscaled = grads()
        before = [p.numpy().copy() for p in inner.parameters()]
        result = scaler.step(opt)
        scaler.update()
    for a, p in zip(before, inner.parameters()):
        np.testing.assert_array_equal(a, p.numpy())
    return scaled, unscaled, result, scaler


@pytest.mark.parametrize("master", [False, True], ids=["grad", "main_grad"])
def test_the_rehearsals_overflow_step_unscales_as_the_cuda_kernel(master):
    scaled, unscaled, result, scaler = scaled_then_unscaled(master)
    first_bad = next(i for i, g in enumerate(scaled) if not np.isfinite(g).all())
    assert first_bad < len(scaled) - 1 and any(np.isfinite(g).any() and (g != 0).any() for g in scaled[first_bad + 1:]), \
        "premise: finite gradients after the first non-finite one (the CPU kernel would zero them)"
    inverse = np.float32(1) / np.float32(2.0**10)
    for mine, source in zip(unscaled, scaled):
        np.testing.assert_array_equal(mine, source * inverse)  # inf stays inf, nan stays nan, the rest exact
    assert result.skipped and result.loss_scale == 2.0**10 and scaler.loss_scale == 2.0**9
    assert host_bool(scaler._found_inf) is True
