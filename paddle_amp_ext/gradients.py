"""The gradients a step applies: the one definition the guard, the clip, unscale and the norm share.

A step applies, for each trainable parameter the optimizer updates, the gradient tensor the
optimizer reads:

- the optimizer's parameters (or the ``parameters`` a call names), each once (a parameter
  listed twice has one gradient tensor: it is unscaled, clipped and counted in a norm once),
  but not a frozen one: ``stop_gradient=True`` (``trainable=False`` sets it). A frozen layer
  keeps the gradient it had when it was frozen (a NaN of an overflow step, say); Paddle's
  optimizers skip it, so it must neither skip every later step nor count in a clip's global norm;
- ``param.main_grad`` (the float32 master gradient) where the optimizer reads it, else
  ``param.grad`` (the tensor Paddle's optimizer reads): which one depends on the class whose
  ``step`` runs and the Paddle version (:func:`paddle_amp_ext._compat.optimizer.main_grad_rule`).
  ``Adam``/``AdamW`` apply ``param.grad`` even where a ``main_grad`` is set (both versions), as
  does every plain optimizer on 2.6.2, so that is what is judged, unscaled and clipped there;
  ``minimize()`` applies ``param.grad`` on both versions.

A ``main_grad`` that is read is checked first (host metadata only, no device sync): it must be a
float ``paddle.Tensor`` of the parameter's shape, else a ``TypeError``/``ValueError`` names the
parameter, the value and the fix (Paddle 3.3.1's optimizer would read past a short one).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

import paddle

from ._compat import optimizer as _opt

Pair = Tuple[paddle.Tensor, paddle.Tensor]
_FLOAT_DTYPES = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def _name(param: paddle.Tensor) -> str:
    return getattr(param, "name", None) or f"<unnamed parameter of shape {list(param.shape)}>"


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} of shape {list(shape)}, dtype {getattr(value, 'dtype', '?')}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def checked_main_grad(param: paddle.Tensor) -> Optional[paddle.Tensor]:
    """``param.main_grad`` (None where unset), checked as a master gradient of ``param``.

    Raises:
        TypeError: not a paddle.Tensor, or not a float dtype (float16/bfloat16/float32/float64).
        ValueError: not the parameter's shape.
    """
    main = _opt.main_grad_value(param)
    if main is None:
        return None
    name, shape = _name(param), list(param.shape)
    fix = (f"set it to a float32 paddle.Tensor of shape {shape} (the parameter's), or to None to let the "
           "optimizer apply param.grad")
    if not isinstance(main, paddle.Tensor):
        raise TypeError(f"Parameter {name!r} has main_grad={_describe(main)} (of type {type(main).__name__}), "
                        f"which the optimizer reads as its float32 master gradient: {fix}.")
    if main.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"Parameter {name!r} has a main_grad of dtype {main.dtype}; a master gradient is a float "
                        f"tensor: {fix} (e.g. main_grad.astype('float32')).")
    if list(main.shape) != shape:
        raise ValueError(f"Parameter {name!r} of shape {shape} has a main_grad of shape {list(main.shape)}; the "
                         f"optimizer would apply it element by element to the parameter: {fix}.")
    return main


def grad_pairs(params: Iterable[paddle.Tensor], rule: str = _opt.MAIN_GRAD_FIRST) -> List[Pair]:
    """(param, gradient) of every trainable parameter of ``params`` that has a gradient, once each.

    Args:
        params: parameters (frozen ones, ``stop_gradient=True``, are left out; one listed twice
            is taken once, at its first place).
        rule: which gradient: one of ``_compat.optimizer.MAIN_GRAD_FIRST`` / ``MAIN_GRAD_ONLY`` /
            ``MAIN_GRAD_NEVER`` (``main_grad`` where set, ``main_grad`` only, ``grad`` only).

    Raises:
        TypeError, ValueError: a ``main_grad`` that is read is not a master gradient of its
            parameter (:func:`checked_main_grad`).
    """
    pairs, seen = [], set()
    for param in params:
        if param.stop_gradient or id(param) in seen:
            continue
        seen.add(id(param))
        grad = None if rule == _opt.MAIN_GRAD_NEVER else checked_main_grad(param)
        if grad is None and rule != _opt.MAIN_GRAD_ONLY:
            grad = _opt.grad_ivar(param)
        if grad is not None:
            pairs.append((param, grad))
    return pairs


def applied_grads(optimizer: Any, parameters: Optional[Iterable[paddle.Tensor]] = None, *,
                  via: str = "step") -> List[Pair]:
    """The (param, gradient) pairs ``optimizer.step()`` (or ``minimize()``) applies.

    Args:
        optimizer: a Paddle optimizer or one of fleet's wrappers.
        parameters: only these parameters (e.g. ``minimize(parameters=...)``); default the
            optimizer's.
        via: ``"step"`` or ``"minimize"`` (which reads ``param.grad`` only).

    Returns:
        The pairs, in the optimizer's parameter order; the gradients are the tensors the update
        reads, so in-place changes (unscale, clip) reach it.

    Raises:
        TypeError, ValueError: a bad ``main_grad`` (:func:`checked_main_grad`).
    """
    params = _opt.optimizer_parameters(optimizer) if parameters is None else parameters
    return grad_pairs(params, _opt.main_grad_rule(optimizer, via))


def clippable(pairs: Iterable[Pair]) -> List[Pair]:
    """The pairs Paddle's clips consider: a gradient, and ``need_clip`` not False."""
    return [(p, g) for p, g in pairs if g is not None and getattr(p, "need_clip", True) is not False]


def grads_of(pairs: Iterable[Pair]) -> List[paddle.Tensor]:
    return [g for _, g in pairs]
