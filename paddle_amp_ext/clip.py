"""Gradient clipping on unscaled gradients, in place, returning the global norm.

Accepts a number (max global norm) or one of Paddle's ``ClipGradByGlobalNorm``,
``ClipGradByNorm`` and ``ClipGradByValue``; the arithmetic is Paddle's, on the kernels Paddle's
own clip uses: one fused squared-L2-norm per gradient, one sum, one in-place multiply per
gradient. The norm stays a device tensor: nothing here reads a value back to the host. One norm
over every gradient given (every parameter group together, each gradient once): Paddle's
optimizer-level clip clips each group by its own norm (docs/differences.md).
"""

from __future__ import annotations

import numbers
from typing import Any, List, Optional, Union

import paddle

from . import _compat
from .gradients import Pair, clippable

GradClip = Union[float, int, "paddle.nn.ClipGradByGlobalNorm", "paddle.nn.ClipGradByNorm",
                 "paddle.nn.ClipGradByValue"]
_CLIP_TYPES = (paddle.nn.ClipGradByGlobalNorm, paddle.nn.ClipGradByNorm, paddle.nn.ClipGradByValue)


def resolve_clip(grad_clip: Any) -> Any:
    """None, or a Paddle clip object for ``grad_clip``.

    Raises:
        TypeError: not a real number (Python or numpy) or one of Paddle's three ClipGrad classes.
        ValueError: a max norm that is not a finite number > 0.
    """
    if grad_clip is None:
        return None
    if isinstance(grad_clip, _CLIP_TYPES):
        return grad_clip
    if isinstance(grad_clip, bool) or not isinstance(grad_clip, numbers.Real):
        raise TypeError(
            "grad_clip must be a float max global norm or a paddle.nn.ClipGradByGlobalNorm, "
            f"ClipGradByNorm or ClipGradByValue. Received: {grad_clip!r} "
            f"(of type {type(grad_clip).__name__})"
        )
    value = float(grad_clip)
    if not 0 < value < float("inf"):
        raise ValueError(f"grad_clip (max global norm) must be > 0 and finite. Received: grad_clip={grad_clip!r}")
    return paddle.nn.ClipGradByGlobalNorm(value)


def global_norm(grads: List[paddle.Tensor]) -> Optional[paddle.Tensor]:
    """sqrt(sum of squares) of all grads, accumulated in float32; a 1-element device tensor.

    One fused squared-L2-norm kernel per gradient (float16/bfloat16 gradients are read as
    float32 first), one stacked sum, one sqrt: Paddle's own ``ClipGradByGlobalNorm`` arithmetic.
    For DistTensor gradients (auto-parallel) the SPMD rules reduce the sharded and partial
    squares over the mesh (Paddle's reshards, the collectives its own clip makes), so the norm
    is the global one, ``Replicate`` on every rank.
    """
    if not grads:
        return None
    squares = [_compat.squared_l2_norm(g if g.dtype == paddle.float32 else g.astype("float32")) for g in grads]
    return _compat.replicated(paddle.sqrt(paddle.stack(squares).sum()))


@paddle.no_grad()
def scale_to_norm_(grads: List[paddle.Tensor], norm: paddle.Tensor, clip_norm: float) -> None:
    """Multiply every grad in place by ``clip_norm / max(norm, clip_norm)`` (in its own dtype)."""
    max_norm = paddle.full_like(norm, clip_norm)
    coef = max_norm / paddle.maximum(norm, max_norm)
    by_dtype = {paddle.float32: coef}
    for grad in grads:
        factor = by_dtype.get(grad.dtype)
        if factor is None:
            factor = by_dtype[grad.dtype] = coef.astype(grad.dtype)
        _compat.multiply_inplace(grad, factor)


@paddle.no_grad()
def clip_grads_(pairs: List[Pair], clip: Any) -> Optional[paddle.Tensor]:
    """Clip the gradients of ``pairs`` in place by ``clip``; return their global norm before.

    Args:
        pairs: (param, gradient) pairs, the gradients the step applies
            (:func:`paddle_amp_ext.gradients.applied_grads`); ``need_clip=False`` ones are left
            out of the norm and the clip, as Paddle's clips do.
        clip: a Paddle ClipGrad object (see :func:`resolve_clip`) or None (norm only).

    Returns:
        The unscaled global L2 norm before clipping, on the device, or None without grads.
    """
    pairs = clippable(pairs)
    grads = [g for _, g in pairs]
    norm = global_norm(grads)
    if norm is None or clip is None:
        return norm
    if isinstance(clip, paddle.nn.ClipGradByGlobalNorm):
        scale_to_norm_(grads, norm, clip.clip_norm)
        return norm
    for (_, grad), (_, new) in zip(pairs, clip(pairs)):
        _compat.assign_grad(new, grad)
    return norm
