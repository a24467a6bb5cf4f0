"""A rehearsed ``F.linear`` in one autograd node: the same values and gradients, less memory traffic.

Op by op (:mod:`.ops`), a white-listed ``linear`` rounds its input, weight and bias, runs Paddle's
float32 kernel and rounds its output: four rounding nodes around the op, each with a fresh
buffer for the gradient it rounds, and on the weight (a 512x512 one is 1 MB) the largest of
them. :func:`linear` computes the same thing in one ``PyLayer``:

- forward: ``x``, ``weight`` and ``bias`` rounded (one already holding low-precision values is
  used as it is), Paddle's float32 ``linear`` kernel, its output rounded in its own buffer (on
  Paddle 2.6, where the bias add promotes to float32, the rounded product plus the bias);
- backward: the output gradient rounded (the gradient of a low-precision output is itself low
  precision), then ``dx = g W^T``, ``dW = x^T g`` (leading axes flattened into rows) and
  ``db = sum(g)``, each rounded in its own buffer as the low-precision kernels' outputs are, for
  the inputs that need a gradient.

Both paths give the same bits on 2.6.2 and 3.3.1 (the tests compare them: the same float32
kernels, summing in the same order). It is taken where the callee is Paddle's ``F.linear``,
every tensor is a dense float32 tensor, the weight is 2-D and the bias (if any) is 1-D; anywhere
else :func:`linear` returns None and the op-by-op path runs. A tensor the node reads in its
backward that was changed in place after the forward raises there, as Paddle's own ops do.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import paddle

from .._compat import kernels, matmul
from .._compat.tensors import is_float32
from .._native import Rounder
from . import pool
from .composite import linear_arguments
from .lowprec import is_low
from .rounding import round_own, round_values


def _dense_float32(value: Any) -> bool:
    return isinstance(value, paddle.Tensor) and value.is_dense() and is_float32(value)


def _eligible(x: Any, weight: Any, bias: Any) -> bool:
    if not (_dense_float32(x) and _dense_float32(weight)) or len(weight.shape) != 2 or not x.shape:
        return False
    return bias is None or (_dense_float32(bias) and list(bias.shape) == [weight.shape[1]])


class _Rounding:
    """Rounding to ``dtype`` by the one-pass kernel where it applies (CPU tensors, contiguous;
    copies then go into buffers of a :class:`~.pool.Lease`), else by :mod:`.rounding`'s exact
    kernels; both give the same bits. One per dtype and kind of place (:func:`_rounding`)."""

    __slots__ = ("dtype", "rounder")

    def __init__(self, dtype: str, on_cpu: bool) -> None:
        self.dtype = dtype
        self.rounder: Optional[Rounder] = kernels.native_rounder(dtype) if on_cpu else None

    def copy(self, tensor: paddle.Tensor, lease: pool.Lease) -> paddle.Tensor:
        """``tensor`` rounded into a buffer of ``lease``, unless it already holds ``dtype`` values."""
        if is_low(tensor, self.dtype):
            return tensor
        return self.rounded(tensor, lease)

    def rounded(self, tensor: paddle.Tensor, lease: pool.Lease) -> paddle.Tensor:
        """``tensor`` rounded into a buffer of ``lease`` (a new tensor where the kernel does not apply)."""
        if self.rounder is not None and tensor.is_contiguous():
            return kernels.round_with(self.rounder, tensor, out=lease.take(tensor))
        return round_values(tensor, self.dtype)

    def own(self, tensor: paddle.Tensor) -> paddle.Tensor:
        """``tensor``, a kernel's fresh output, rounded in its own buffer."""
        if self.rounder is not None:
            return kernels.round_with(self.rounder, tensor, in_place=True)
        return round_own(tensor, self.dtype)


_roundings: Dict[Tuple[str, bool], _Rounding] = {}


def _rounding(dtype: str, place: Any) -> _Rounding:
    """The :class:`_Rounding` of ``dtype`` for tensors on ``place`` (made once; :func:`clear`)."""
    key = (dtype, place.is_cpu_place())
    rounding = _roundings.get(key)
    if rounding is None:
        rounding = _roundings[key] = _Rounding(*key)
    return rounding


def clear() -> None:
    """Forget the roundings made so far (the last rehearsal ended: the kernels are asked again
    by the next)."""
    _roundings.clear()


def _forward(rounding: _Rounding, x: paddle.Tensor, weight: paddle.Tensor, bias: Optional[paddle.Tensor],
             bias_rounded: bool, lease: pool.Lease) -> Tuple[paddle.Tensor, List[paddle.Tensor]]:
    inputs = [rounding.copy(x, lease), rounding.copy(weight, lease)]
    if bias is None or bias_rounded:
        out = matmul.linear(*inputs, None if bias is None else rounding.copy(bias, lease))
        return rounding.own(out), inputs
    return matmul.add_(rounding.own(matmul.linear(*inputs, None)), bias), inputs  # float32 bias add


class _Linear(paddle.autograd.PyLayer):
    @staticmethod
    def forward(ctx, x, weight, bias, rounding, bias_rounded):  # noqa: D102
        lease = pool.Lease()
        out, inputs = _forward(rounding, x, weight, bias, bias_rounded, lease)
        ctx.bias_rounded = bias_rounded
        ctx.lease = lease  # read by this node until it is gone (after its backward): then released
        ctx.rounding = rounding
        ctx.needs = (not x.stop_gradient, not weight.stop_gradient, None if bias is None else not bias.stop_gradient)
        ctx.save_for_backward(*inputs)
        # the caller's own tensors the backward reads (not rounded copies): their versions now
        ctx.versions = [(name, t, matmul.inplace_version(t)) for name, t, kept in
                        (("x", x, inputs[0]), ("weight", weight, inputs[1])) if kept is t]
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        for name, tensor, version in ctx.versions:
            now = matmul.inplace_version(tensor)
            if now != version:
                raise RuntimeError(
                    f"The {name} of a rehearsed linear was changed in place after its forward (its "
                    f"in-place version is {now}, {version} was saved), so its gradient cannot be "
                    "computed. Change a copy instead (x = x.clone() before the in-place op).")
        x, weight = ctx.saved_tensor()
        rounding = ctx.rounding
        lease = pool.Lease()
        bias_grad = None if ctx.bias_rounded or not ctx.needs[2] else matmul.sum_rows(grad)  # float32 add
        grad = rounding.rounded(grad, lease)
        need_x, need_weight, need_bias = ctx.needs
        if need_x and need_weight:
            both = matmul.matmul_grads(x, weight, grad)
        else:
            both = (matmul.input_grad(grad, weight) if need_x else None,
                    matmul.weight_grad(x, grad) if need_weight else None)
        grads = [None if g is None else rounding.own(g) for g in both]
        if need_bias is not None:
            grads.append(bias_grad if bias_grad is not None or not need_bias else rounding.own(matmul.sum_rows(grad)))
        lease.release()  # every gradient is a new tensor: the rounded one is read no more
        return tuple(grads)


def linear(original: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype: str,
           bias_rounded: bool = True) -> Optional[paddle.Tensor]:
    """``original(*args, **kwargs)`` (``F.linear``) as one low-precision ``linear``, or None
    where this path does not apply (see the module docstring).

    Args:
        original: the function the call was for; only Paddle's own ``F.linear`` is run here.
        args, kwargs: the call's arguments.
        dtype: ``"float16"`` or ``"bfloat16"``.
        bias_rounded: the bias is an input of the low-precision op (Paddle 3.x's ``linear_v2``);
            False: the low-precision product plus the bias in float32, its gradient the float32
            sum of the output gradient (Paddle 2.6's ``matmul`` and a promoting ``add``).

    Returns:
        The output (float32; with ``bias_rounded`` or no bias, rounded, not yet marked low), or None.
    """
    if not getattr(original, "__module__", "").startswith("paddle.") or not paddle.in_dynamic_mode():
        return None
    bound = linear_arguments(args, kwargs)
    if bound is None or not _eligible(*bound):
        return None
    x, weight, bias = bound
    rounding = _rounding(dtype, weight.place)
    if paddle.is_grad_enabled() and not all(t is None or t.stop_gradient for t in bound):
        return _Linear.apply(x, weight, bias, rounding, bias_rounded)
    lease = pool.Lease()
    out = _forward(rounding, x, weight, bias, bias_rounded, lease)[0]
    lease.release()
    return out
