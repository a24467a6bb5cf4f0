"""Paddle's float32 ``linear`` and ``matmul`` kernels called directly, for the rehearsal's
one-node Linear (:mod:`paddle_amp_ext.rehearsal.fused`).

Relies on ``paddle._C_ops.{linear, add_, matmul, sum, reshape, assign}`` with the signatures of
paddlepaddle 2.6.2 and 3.3.1 (checked on both, CPU), on ``paddle._C_ops.matmul_grad`` where it
exists (3.3.1; the same bits as the two matmuls it replaces, checked for 1-D, 2-D and 3-D
inputs), and on ``Tensor._inplace_version()``
(the counter Paddle's own ops check before a backward reads a saved tensor). Calling the
kernels directly skips the public functions' Python dispatch, and with it the rehearsal's own
wrappers, which a backward pass (run outside any wrapped op) would otherwise enter again.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import paddle

_C = paddle._C_ops
_MATMUL_GRAD = getattr(_C, "matmul_grad", None)  # Paddle 3.x


def linear(x: paddle.Tensor, weight: paddle.Tensor, bias: Optional[paddle.Tensor]) -> paddle.Tensor:
    """``x @ weight + bias`` by Paddle's ``linear`` kernel (the one ``F.linear`` calls in dygraph)."""
    return _C.linear(x, weight, bias)


def add_(x: paddle.Tensor, y: paddle.Tensor) -> paddle.Tensor:
    """``x += y`` (``y`` broadcast) by Paddle's in-place ``add_`` kernel; returns ``x``."""
    return _C.add_(x, y)


def matmul(x: paddle.Tensor, y: paddle.Tensor, transpose_x: bool = False, transpose_y: bool = False) -> paddle.Tensor:
    """``x @ y`` by Paddle's ``matmul`` kernel, either side transposed (its last two axes)."""
    return _C.matmul(x, y, transpose_x, transpose_y)


def input_grad(grad: paddle.Tensor, weight: paddle.Tensor) -> paddle.Tensor:
    """``grad @ weight^T``: the gradient of ``x`` in ``x @ weight`` for the output gradient ``grad``."""
    return matmul(grad, weight, False, True)


def weight_grad(x: paddle.Tensor, grad: paddle.Tensor) -> paddle.Tensor:
    """``rows(x)^T @ rows(grad)``: the gradient of a 2-D ``weight`` in ``x @ weight``."""
    return matmul(rows(x), rows(grad), True, False)


def matmul_grads(x: paddle.Tensor, weight: paddle.Tensor, grad: paddle.Tensor) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """``(input_grad(grad, weight), weight_grad(x, grad))`` by one ``matmul_grad`` kernel call where
    Paddle has it and ``x`` is contiguous, else by the two."""
    if _MATMUL_GRAD is not None and x.is_contiguous():
        return _MATMUL_GRAD(x, weight, grad, False, False)
    return input_grad(grad, weight), weight_grad(x, grad)


def rows(x: paddle.Tensor) -> paddle.Tensor:
    """``x`` as a 2-D tensor of its last axis: every leading axis flattened into the rows (a
    contiguous copy first where ``x`` is a strided view)."""
    if not x.is_contiguous():
        x = _C.assign(x)
    return _C.reshape(x, [-1, x.shape[-1]])


def sum_rows(x: paddle.Tensor) -> paddle.Tensor:
    """``x`` summed over every axis but the last, in float32 (a copy of ``x`` when it is 1-D)."""
    axes: List[int] = list(range(len(x.shape) - 1))
    if not axes:
        return _C.assign(x)
    return _C.sum(x, axes, paddle.float32, False)


def inplace_version(tensor: paddle.Tensor) -> int:
    """How many in-place ops have changed ``tensor`` so far."""
    return int(tensor._inplace_version())
