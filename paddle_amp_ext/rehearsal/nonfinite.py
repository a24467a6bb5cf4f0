"""What a GPU returns for inf and NaN, where Paddle's CPU kernels return something else.

A rehearsal runs Paddle's CPU kernels, and some of them treat non-finite values unlike Paddle's
CUDA kernels (docs/nonfinite.md has the table, measured on the CPU by
``scripts/nonfinite_table.py`` and read from the CUDA sources). The CUDA softmax subtracts the
row maximum, so a row holding +inf or NaN, or a row of -inf only (a fully masked row), becomes
NaN; Paddle's CPU softmax returns a uniform row instead (for +inf from 8 elements on, for NaN
and all -inf at lengths that are multiples of 8). A rehearsal
that kept the CPU's answer would report a finite loss where a GPU run skips the step.

:func:`on_gpu_terms` gives, for an op name, Paddle's function with a fix-up that returns what the
CUDA kernel returns:

- ``softmax``, ``log_softmax``: a row holding +inf or NaN, or only -inf, is NaN, forward and
  backward; a -inf entry of a finite row gives exactly 0 (the CPU: about 1e-30 from 371 on),
  and ``log_softmax`` -inf there (the CPU: about -64);
- ``cross_entropy``, ``softmax_with_cross_entropy`` (from logits): the loss of such a row is NaN
  (an ignored label's loss stays 0), and so is its gradient; a hard label whose logit is -inf
  gives +inf (the CPU gives about 64);
- ``relu``: the gradient is ``dout`` where the output is positive and 0 elsewhere, also where
  ``dout`` is inf or NaN (the CPU multiplies by the mask: inf * 0 = NaN);
- ``sqrt``: +inf gives +inf and a zero gradient (the CPU's vectorised kernel gives NaN).

The fix-ups act only on CPU tensors holding a non-finite value. Each call first checks its input
(``relu``: its output gradient) once: one read of the tensor by the compiled finiteness scan
(about 5 us for 64K values; nothing waits, a CPU tensor is already there), or where that kernel
cannot be had, its sum, one number read on the host. Only when the check fails do the exact
per-row checks run (with the sum, a finite input whose sum overflows takes them too, and gets
the CPU's own result).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Dict, Optional, Tuple

import paddle

from .._compat import kernels
from .._compat.tensors import add_grad_hook, is_float32

NAN, INF = float("nan"), float("inf")


def _cpu_float32(value: Any) -> bool:
    return isinstance(value, paddle.Tensor) and is_float32(value) and value.place.is_cpu_place()


def all_finite(tensor: paddle.Tensor) -> bool:
    """Whether ``tensor`` may be treated as finite (an empty tensor is): one scan of a CPU tensor by
    the compiled kernel, else its sum tested (:func:`~paddle_amp_ext._compat.kernels.all_finite`;
    a finite tensor whose sum overflows then reads as not finite, which only sends it to the exact
    checks)."""
    if not math.prod(tensor.shape):  # not Tensor.size: 9 us
        return True
    return kernels.all_finite(tensor)


@paddle.no_grad()
def bad_rows(x: paddle.Tensor, axis: int) -> paddle.Tensor:
    """Bool mask, ``x``'s shape with ``axis`` kept as 1: the rows that hold +inf or NaN, or only
    -inf, which CUDA's max-subtracting softmax turns into NaN."""
    poison = paddle.logical_or(paddle.isnan(x), x == INF)
    return paddle.logical_or(paddle.any(poison, axis=axis, keepdim=True),
                             paddle.all(x == -INF, axis=axis, keepdim=True))


def _nan_where(mask: paddle.Tensor, other: float) -> paddle.Tensor:
    """float32 tensor of ``mask``'s shape: NaN where ``mask``, ``other`` elsewhere (no gradient)."""
    ones = paddle.ones(mask.shape, dtype="float32")
    return paddle.where(mask, ones * NAN, ones * other)


def _axis(bound: inspect.BoundArguments) -> int:
    return int(bound.arguments.get("axis", -1))


@functools.cache
def _signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


def _bind(original: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> inspect.BoundArguments:
    bound = _signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def _first(args: Tuple[Any, ...], kwargs: Dict[str, Any], *names: str) -> Any:
    if args:
        return args[0]
    return next((kwargs[name] for name in names if name in kwargs), None)


def _softmax(original: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any], log: bool = False) -> Any:
    out = original(*args, **kwargs)
    x = _first(args, kwargs, "x")
    if not _cpu_float32(x) or all_finite(x):
        return out
    axis = _axis(_bind(original, args, kwargs))
    with paddle.no_grad():
        bad = bad_rows(x, axis)
        if log:  # -inf - max - log(sum) is -inf: added to the CPU's -64
            fix = paddle.where(x == -INF, paddle.full_like(x, -INF), paddle.zeros_like(x))
        else:  # exp(-inf - max) is 0, where the CPU's vectorised exp gives about 1e-39
            fix = paddle.where(x == -INF, paddle.zeros_like(x), paddle.ones_like(x))
    factor = _nan_where(bad, 1.0).astype(out.dtype)
    out = out * factor  # NaN rows, and NaN gradients through them
    return out + fix.astype(out.dtype) if log else out * fix.astype(out.dtype)


def _cross_entropy(original: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    logits = _first(args, kwargs, "input", "logits")
    if not _cpu_float32(logits) or all_finite(logits):
        return original(*args, **kwargs)
    bound = _bind(original, args, kwargs)
    named = bound.arguments
    if not named.get("use_softmax", True) or named.get("return_softmax", False):
        return original(*args, **kwargs)  # probabilities in, or a softmax out: not fixed here
    axis = _axis(bound)
    label = named["label"]
    hard = not named.get("soft_label", False)
    ignore = int(named.get("ignore_index", -100))
    with paddle.no_grad():
        bad = bad_rows(logits, axis)
        counted = bad
        label_rows = None
        if hard and label.size * logits.shape[axis] == logits.size:
            label_rows = label.reshape(bad.shape).astype("int64")
            counted = paddle.logical_and(bad, label_rows != ignore)
        nan_rows = _nan_where(counted, 0.0)
    name = "input" if "input" in named else "logits"
    named[name] = paddle.where(bad, paddle.zeros_like(logits), logits)  # finite rows: the CPU's answer
    loss = original(*bound.args, **bound.kwargs)
    poisoned = paddle.where(counted, logits, paddle.zeros_like(logits)) * nan_rows
    penalty = paddle.sum(poisoned, axis=axis, keepdim=True)  # NaN rows, NaN gradients there
    if label_rows is not None and not named.get("label_smoothing", 0.0):
        with paddle.no_grad():
            index = paddle.where(label_rows == ignore, paddle.zeros_like(label_rows), label_rows)
            at_label = paddle.take_along_axis(logits, index, axis=axis)
            minus_inf = paddle.logical_and(at_label == -INF, label_rows != ignore)
            infinite = paddle.where(minus_inf, paddle.full_like(at_label, INF), paddle.zeros_like(at_label))
        penalty = penalty + infinite
    if loss.size == penalty.size:
        return loss + penalty.reshape(loss.shape)
    return loss + paddle.sum(penalty)  # 'mean'/'sum': NaN or +inf when a counted row has one


def _relu(original: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    if not paddle.is_grad_enabled():
        return original(*args, **kwargs)
    out = original(*args, **kwargs)
    if out.stop_gradient or not _cpu_float32(out):
        return out
    kept = out.detach()  # the hook holds the values, not the tensor that holds the hook

    def gpu_gradient(grad: paddle.Tensor) -> Optional[paddle.Tensor]:
        if all_finite(grad):
            return None
        return paddle.where(kept > 0, grad, paddle.zeros_like(grad))

    add_grad_hook(out, gpu_gradient)
    return out


def _sqrt(original: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    x = _first(args, kwargs, "x")
    if not _cpu_float32(x) or all_finite(x):
        return original(*args, **kwargs)
    with paddle.no_grad():
        plus_inf = x == INF
    clean = paddle.where(plus_inf, paddle.ones_like(x), x)
    rest = args[1:] if args else ()
    out = original(clean, *rest, **{k: v for k, v in kwargs.items() if k != "x"})
    return paddle.where(plus_inf, paddle.full_like(out, INF), out)


#: op name (as :mod:`.ops` wraps it) -> fix-up(original, args, kwargs).
FIXES: Dict[str, Callable[[Callable, Tuple[Any, ...], Dict[str, Any]], Any]] = {
    "softmax": functools.partial(_softmax, log=False),
    "log_softmax": functools.partial(_softmax, log=True),
    "cross_entropy": _cross_entropy,
    "softmax_with_cross_entropy": _cross_entropy,
    "relu": _relu,
    "sqrt": _sqrt,
}


def on_gpu_terms(name: str, original: Callable) -> Callable:
    """``original`` (Paddle's ``name``), returning what Paddle's CUDA kernel returns for inf and
    NaN inputs; ``original`` itself for ops whose CPU kernel already agrees."""
    fix = FIXES.get(name)
    if fix is None:
        return original

    @functools.wraps(original)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return fix(original, args, kwargs)

    return kernel
