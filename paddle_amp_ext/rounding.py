"""Round float32 tensors to float16/bfloat16 values and back, exactly, differentiably.

Paddle 3.x's CPU cast rounds to nearest-even, so ``t.astype('float16').astype('float32')`` is
exact there. Paddle 2.6's CPU cast truncates (65519 becomes inf, 1e-5 loses an ulp), so a probe
decides once per process and dtype; where the cast is not exact, an arithmetic rounding on
float32 (exponent from ``frexp``, ties-to-even by the ``(x + 1.5 * 2**23) - 1.5 * 2**23`` trick)
is used, inside a PyLayer that rounds the gradient the same way.

Note: Paddle's float ``!=`` treats |a - b| < 1e-8 as equal, so zero tests here use ``abs(x) > 0``.
"""

from __future__ import annotations

import functools
from typing import Dict, Tuple

import numpy as np
import paddle

#: dtype -> (mantissa bits, smallest exponent of the quantum, largest finite value)
FORMATS: Dict[str, Tuple[int, int, float]] = {
    "float16": (10, -24, 65504.0),
    "bfloat16": (7, -133, 3.3895313892515355e38),
}
_MAGIC = 1.5 * 2.0**23


@paddle.no_grad()
def round_exact(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """Round float32 ``x`` to the nearest ``dtype`` value (ties to even), overflow to inf."""
    mantissa, min_exp, largest = FORMATS[dtype]
    _, exponent = paddle.frexp(x)  # |x| = m * 2**exponent with m in [0.5, 1)
    power = paddle.maximum(exponent.astype(x.dtype) - (1 + mantissa), paddle.full_like(x, float(min_exp)))
    quantum = paddle.pow(paddle.full_like(x, 2.0), power)
    magic = paddle.full_like(x, _MAGIC)
    rounded = ((x / quantum + magic) - magic) * quantum
    rounded = paddle.where(paddle.abs(rounded) > largest, paddle.sign(x) * float("inf"), rounded)
    return paddle.where(paddle.isfinite(x) & (paddle.abs(x) > 0.0), rounded, x)


class _RoundTrip(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x, dtype):  # noqa: D102
        ctx.dtype = dtype
        return round_exact(x, dtype)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return round_exact(grad, ctx.dtype)


_PROBE = np.array([65519.0, 65520.0, 1e-5, 2049.0, 2051.0, 2.9802322e-08, 1.00390625, 1.01171875,
                   3.0e38, 1e-8, -7.0e4, 0.1], dtype=np.float32)


@functools.cache
def cast_is_exact(dtype: str) -> bool:
    """Whether Paddle's cast to ``dtype`` and back rounds to nearest-even on this device."""
    probe = paddle.to_tensor(_PROBE)
    try:
        cast = probe.astype(dtype).astype("float32").numpy()
    except Exception:  # no cast kernel for this dtype here
        return False
    return bool(np.array_equal(cast, round_exact(probe, dtype).numpy()))


def round_trip(x: paddle.Tensor, dtype: str = "float16") -> paddle.Tensor:
    """``x`` as ``dtype`` would store it, as float32; gradients are rounded the same way."""
    if cast_is_exact(dtype):
        return x.astype(dtype).astype("float32")
    return _RoundTrip.apply(x, dtype)
