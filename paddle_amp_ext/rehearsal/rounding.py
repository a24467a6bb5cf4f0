"""Round float32 tensors to float16/bfloat16 values and back, exactly, differentiably.

float16: :func:`paddle_amp_ext._compat.kernels.round_to_float16`, one pass of a compiled F16C
kernel or thirteen float32 kernels, exact for every float32 value on both Paddle versions and
faster than a cast pair from a few thousand elements on (on 3.3.1 Paddle's CPU cast converts in
software, 2.3x slower than the thirteen kernels at 512x512; on 2.6 it is not exact: 65519 becomes
inf), so small tensors take the cast where it is exact: its backward is Paddle's own.

bfloat16: :func:`paddle_amp_ext._compat.kernels.round_to_bfloat16`, one pass of a compiled
integer kernel (built with the F16C one), 30 times faster than a cast pair at 512x512; small
tensors and machines without it take Paddle's kernels, with the same results: Paddle 3.x's CPU
cast rounds to nearest-even, so ``t.astype('bfloat16').astype('float32')`` is exact there (a
probe decides once per process); where the cast is not exact (2.6), an arithmetic rounding on
float32 (:func:`round_exact`).

:func:`round_trip` is differentiable: the gradient is rounded the same way, as the backward of
a cast to the low-precision type and back rounds it.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, Tuple

import numpy as np
import paddle

from .._compat import autoparallel, kernels
from .._compat.backward import saved_by_backward
from .._compat.kernels import round_to_bfloat16, round_to_float16, rounds_in_place
from .._native import vector_bits

#: dtype -> (Veltkamp split factor 2**(24 - p) + 1 for p significand bits, smallest normal,
#: magic constant whose float32 ulp is the subnormal quantum, overflow threshold: the midpoint
#: between the largest finite value and the next power of two, which rounds (to even) to inf)
FORMATS: Dict[str, Tuple[float, float, float, float]] = {
    "float16": (2.0**13 + 1, 2.0**-14, 0.75, 65520.0),
    "bfloat16": (2.0**16 + 1, 2.0**-126, 1.5 * 2.0**-110, (2.0 - 2.0**-8) * 2.0**127),
}


@paddle.no_grad()
def round_exact(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """Round float32 ``x`` to the nearest ``dtype`` value (ties to even), overflow to inf.

    Normal range: Veltkamp's split ``c = x * (2**s + 1); hi = c - (c - x)`` keeps the top
    ``24 - s`` significand bits, rounded to nearest-even. Subnormal range: ``(x + m) - m`` with
    ``m`` chosen so its float32 ulp is the subnormal quantum; a value rounded to zero keeps its
    sign, as the storage and the one-pass kernels keep it. Every step is one float32
    op; inf and nan pass through (the overflow branch keeps their sign, nan stays nan).
    """
    factor, smallest_normal, magic, overflow = FORMATS[dtype]
    half_quantum = magic / 3 * 2.0**-23  # magic is 1.5 * 2**k, its float32 ulp 2**(k - 23)
    size = paddle.abs(x)
    if dtype == "bfloat16":  # keep x * factor finite near float32's maximum
        big = size > 2.0**100
        x_split = paddle.where(big, x * 2.0**-64, x)
        c = x_split * factor
        high = paddle.where(big, (c - (c - x_split)) * 2.0**64, c - (c - x_split))
    else:
        c = x * factor
        high = c - (c - x)
    # (x + m) - m is +0 where x rounds to zero: x times a zero tensor keeps the sign (not x * 0.0:
    # Paddle's scale adds a +0 bias; not where x == 0: Paddle's CPU equal is |a - b| < 1e-8)
    zero = paddle.multiply(x, paddle.zeros([1], x.dtype))
    tiny = paddle.where(size > half_quantum, (x + magic) - magic, zero)
    rounded = paddle.where(size < smallest_normal, tiny, high)
    return paddle.where(size >= overflow, x * float("inf"), rounded)


#: Below this many elements a cast pair (two kernel launches, Paddle's own backward) beats a
#: one-pass kernel or the thirteen-pass one in a PyLayer round trip.
SMALL = 4096


def _numel(x: paddle.Tensor) -> int:
    """The elements the kernels round in this process: a DistTensor's local value's (they round
    that), but a ``Partial`` one's global count (its rounding reshards it, a collective every rank
    must take the same path to: uneven shards differ in size)."""
    if autoparallel.is_dist(x) and not autoparallel.is_partial(x):
        return math.prod(autoparallel.local_value(x).shape)
    return math.prod(x.shape)


def _cast_rounds(x: paddle.Tensor, dtype: str) -> bool:
    """Whether Paddle's cast pair is the way to round ``x``: exact here, and below :data:`SMALL`
    elements where a faster kernel exists (float16 always; bfloat16 with the one-pass kernel)."""
    if not cast_is_exact(dtype):
        return False
    return _numel(x) < SMALL or (dtype == "bfloat16" and kernels.bf16_rounder() is None)


def _round(x: paddle.Tensor, dtype: str, in_place: bool = False) -> paddle.Tensor:
    """``x`` (float32, no gradient) rounded by the fastest exact kernel for ``dtype`` besides
    the cast pair; into ``x`` itself with ``in_place`` where ``rounds_in_place`` says so."""
    if dtype == "float16":
        return round_to_float16(x, in_place)
    out = round_to_bfloat16(x, in_place)
    if out is not None:
        return out
    return x.astype(dtype).astype("float32") if cast_is_exact(dtype) else round_exact(x, dtype)


def round_values(x: paddle.Tensor, dtype: str = "float16") -> paddle.Tensor:
    """``x`` (float32) as ``dtype`` would store it, as a new float32 tensor; no gradient."""
    if not x.stop_gradient:
        x = x.detach()
    if _cast_rounds(x, dtype):
        return x.astype(dtype).astype("float32")
    return _round(x, dtype)


def round_own(x: paddle.Tensor, dtype: str = "float16") -> paddle.Tensor:
    """``x`` (float32, no gradient: an op's fresh output that nothing else holds and no backward
    reads) as ``dtype`` would store it, written into ``x`` itself where the kernel can
    (:func:`~paddle_amp_ext._compat.kernels.rounds_in_place`); returns the rounded tensor."""
    if _cast_rounds(x, dtype):
        return x.astype(dtype).astype("float32")
    return _round(x, dtype, in_place=rounds_in_place(_numel(x), dtype))


class _RoundTripInPlace(paddle.autograd.PyLayer):
    """The round trip written into its input (an op's fresh output), where
    :func:`~paddle_amp_ext._compat.kernels.rounds_in_place` says it pays."""

    @staticmethod
    def forward(ctx, x, dtype):  # noqa: D102
        ctx.dtype = dtype
        return _round(x, dtype, in_place=True)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return round_values(grad, ctx.dtype)


class _RoundTrip(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x, dtype):  # noqa: D102
        ctx.dtype = dtype
        return round_values(x, dtype)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return round_values(grad, ctx.dtype)


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


def round_trip(x: paddle.Tensor, dtype: str = "float16", in_place: bool = False) -> paddle.Tensor:
    """``x`` as ``dtype`` would store it, as float32; gradients are rounded the same way.

    ``in_place``: ``x`` is an op's fresh output that nothing else holds; it is then rounded in
    its own buffer where :func:`~paddle_amp_ext._compat.kernels.rounds_in_place` says so (a
    fresh 8 MB CPU buffer costs ~3.5 ms of page faults), unless the grad node that made it
    reads it in its backward (:func:`~paddle_amp_ext._compat.backward.saved_by_backward`:
    ``silu``, ``softmax``, ``divide``...; that node would raise). Outside dygraph (a static
    program, code being converted by ``to_static``) this is Paddle's cast pair, the op a static
    program can hold.
    """
    if not math.prod(x.shape):  # nothing to round (on 2.6.2 the arithmetic kernels' in-place
        return x                # passes on an empty output inside a PyLayer broke its backward)
    if not paddle.in_dynamic_mode() or _cast_rounds(x, dtype):  # the cast's backward is a cast
        return x.astype(dtype).astype("float32")
    in_place = in_place and rounds_in_place(_numel(x), dtype)
    if x.stop_gradient or not paddle.is_grad_enabled():
        return _round(x, dtype, in_place=True) if in_place else round_values(x, dtype)
    if in_place and not saved_by_backward(x):
        return _RoundTripInPlace.apply(x, dtype)
    return _RoundTrip.apply(x, dtype)


def kernel(dtype: str = "float16") -> str:
    """Which kernel rounds large ``dtype`` tensors in this process, in words (for reports)."""
    width = {512: " (AVX-512)", 256: "", 128: ""}.get(vector_bits() or 0, "")
    if dtype == "float16":
        return "F16C kernel" + width if kernels.fp16_rounder() is not None else "Paddle kernels"
    if kernels.bf16_rounder() is not None:
        return "bf16 kernel" + width
    return "Paddle cast" if cast_is_exact(dtype) else "Paddle arithmetic"
