"""``check_finite_and_unscale`` with the arithmetic of Paddle's CUDA kernel, on any place.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1): ``_C_ops.multiply_`` (an in-place
multiply by a 1-element factor, exact for dense tensors on both versions). The CUDA kernel
(``paddle/phi/kernels/gpu/amp_kernel.cu``) was read, not run: there is no GPU here. Used by
:mod:`.scaler` (dense gradients) and :mod:`.autoparallel` (the local values of DistTensor
gradients), so neither imports the other for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import paddle
from paddle import _C_ops

if TYPE_CHECKING:
    from paddle import Tensor


@paddle.no_grad()
def unscale_as_cuda(grads: Iterable[Tensor], scale: Tensor) -> Tensor:
    """``check_finite_and_unscale`` as Paddle's CUDA kernel computes it, in place; found_inf.

    The CUDA kernel (``paddle/phi/kernels/gpu/amp_kernel.cu``, read, not run: no GPU here)
    multiplies every element of every tensor by ``1 / scale`` (the reciprocal in float32, the
    product in float32 for float16/bfloat16/float32 gradients and rounded to the gradient's
    dtype, in float64 for float64 ones) and sets found_inf where a result is not finite. The CPU
    kernel (``paddle/phi/kernels/cpu/amp_kernel.cc``) instead multiplies by 0 the first tensor
    holding inf/nan and every tensor after it; that is never what a GPU step leaves behind.

    Args:
        grads: dense tensors (a DistTensor's local value is one), changed in place.
        scale: a 1-element dense tensor, the loss scale.

    Returns:
        A dense ``[1]`` bool tensor, True when a result is not finite (False for no tensors).

    Costs a few kernels per gradient (multiply, finite test) and no device-to-host read.
    """
    inverse = paddle.reciprocal(scale.astype("float32")).reshape([1])
    by_dtype: dict = {}
    found = paddle.to_tensor([False])
    for grad in grads:
        dtype = grad.dtype
        if dtype in (paddle.float32, paddle.float64):
            factor = by_dtype.get(dtype)
            if factor is None:
                factor = by_dtype[dtype] = (inverse if dtype == paddle.float32
                                            else paddle.reciprocal(scale.astype("float64")).reshape([1]))
            _C_ops.multiply_(grad, factor)
        else:  # float16 / bfloat16: the product in float32, rounded to the gradient's dtype
            paddle.assign((grad.astype("float32") * inverse).astype(dtype), output=grad)
        found = paddle.logical_or(found, paddle.logical_not(paddle.isfinite(grad).all()).reshape([1]))
    return found
