"""The bfloat16 helpers PaddleFormers' ``fp8_utils.py`` calls that a CPU build lacks.

Paddle 3.3.1's CPU ``swiglu`` (and ``swiglu_grad``) kernels are registered for float32/float64
only; the GPU kernels compute ``silu(x) * y`` in float32 (the "MPType" of bfloat16) and round the
result to bfloat16 once. These do the same with float32 Paddle ops.
"""

from __future__ import annotations

from typing import Optional, Tuple

import paddle
import paddle.nn.functional as functional


def swiglu(x: paddle.Tensor, y: Optional[paddle.Tensor] = None, name: Optional[str] = None) -> paddle.Tensor:
    """``silu(x) * y`` (``x`` split in halves along the last axis when ``y`` is None), in float32,
    rounded once to ``x``'s dtype; differentiable."""
    if y is None:
        x, y = paddle.chunk(x, chunks=2, axis=-1)
    dtype = x.dtype
    return (functional.silu(x.astype("float32")) * y.astype("float32")).astype(dtype)


def swiglu_grad(x: paddle.Tensor, y: Optional[paddle.Tensor], dout: paddle.Tensor
                ) -> Tuple[paddle.Tensor, Optional[paddle.Tensor]]:
    """``paddle._C_ops.swiglu_grad``: (dx, dy) of :func:`swiglu`; with ``y`` None, dx covers both
    halves of ``x`` and dy is None."""
    joined = y is None
    a, b = paddle.chunk(x, chunks=2, axis=-1) if joined else (x, y)
    dtype = a.dtype
    a32, b32, d32 = a.astype("float32"), b.astype("float32"), dout.astype("float32")
    sig = functional.sigmoid(a32)
    da = d32 * b32 * sig * (1.0 + a32 * (1.0 - sig))
    db = d32 * a32 * sig
    if joined:
        return paddle.concat([da, db], axis=-1).astype(dtype), None
    return da.astype(dtype), db.astype(dtype)
