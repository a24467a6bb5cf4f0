"""``keep_fp32``: layers that stay in float32 under AMP, without replacing ``forward``.

A kept layer's class is swapped for a subclass of its own class (same name, cached per class)
whose ``forward`` runs the original one with autocast off and low-precision positional inputs cast to
float32. Nothing is stored on the instance but its class, so a kept model survives
``copy.deepcopy`` (the copy's layer runs the copy's weights), pickles wherever the plain model
does (it pickles as the original class and is re-marked on load), converts with
``paddle.jit.to_static`` and saves with ``paddle.jit.save``. The mark is the class:
:func:`is_kept_fp32` reads it, and ``decorate``, the rehearsal and the doctor honour it.

Where autocast cannot be turned off (Paddle 2.6's legacy static graph, where AMP is a program
rewrite and ``auto_cast`` raises), the kept layer's forward runs as written.

Example:
    >>> model = keep_fp32(model, ["head"])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import difflib
import threading
from typing import Any, Dict, Iterable

import paddle

from . import _compat, _state

_BASE = "_paddle_amp_ext_kept_base"
_KEPT: Dict[type, type] = {}
_LOCK = threading.Lock()


class _Fp32Scope:
    """Autocast off where Paddle can turn it off (dygraph, 3.x PIR programs), and a float32
    region for the rehearsal (nothing in it is rounded)."""

    def __enter__(self) -> None:
        # Paddle's own auto_cast (also while paddle.amp is routed), where it can be entered
        supported = _compat.static_amp_supported()
        self._paddle = _compat.paddle_auto_cast(enable=False) if supported else contextlib.nullcontext()
        self._paddle.__enter__()
        self._token = _state.enter_fp32()

    def __exit__(self, *exc: Any) -> Any:
        _state.exit_fp32(self._token)
        return self._paddle.__exit__(*exc)


def _fp32_scope() -> _Fp32Scope:
    return _Fp32Scope()


def _kept_forward(self: paddle.nn.Layer, *args: Any, **kwargs: Any) -> Any:
    # Written for paddle.jit.to_static too: no closure variables and no helper that walks
    # containers (both versions' converters lose them); the class attribute names the original.
    with _fp32_scope():
        args = [a.astype("float32") if paddle.is_tensor(a) and a.dtype in (paddle.float16, paddle.bfloat16)
                else a for a in args]
        return type(self)._paddle_amp_ext_kept_base.forward(self, *args, **kwargs)


def _kept_reduce_ex(self: paddle.nn.Layer, protocol: int) -> Any:
    return _rebuild, (getattr(type(self), _BASE),), self.__getstate__()


def _rebuild(base: type) -> paddle.nn.Layer:
    """Unpickle/deepcopy helper: an empty instance of ``base``, marked as kept."""
    layer = base.__new__(base)
    layer.__class__ = kept_class(base)
    return layer


def kept_class(base: type) -> type:
    """The cached keep-fp32 subclass of ``base``: the same ``__name__``, this module's
    ``__module__`` (``paddle.jit.to_static``'s bytecode mode treats classes from Paddle's modules
    as Paddle's own layers and would not run this ``forward``)."""
    with _LOCK:
        kept = _KEPT.get(base)
        if kept is None:
            namespace = {"forward": _kept_forward, "__reduce_ex__": _kept_reduce_ex, _BASE: base,
                         "__module__": __name__, "__doc__": base.__doc__}
            kept = _KEPT[base] = type(base.__name__, (base,), namespace)
        return kept


def is_kept_fp32(layer: paddle.nn.Layer) -> bool:
    """Whether :func:`keep_fp32` marked ``layer``."""
    return _BASE in type(layer).__dict__


def release_fp32(layer: paddle.nn.Layer) -> paddle.nn.Layer:
    """Undo :func:`keep_fp32` on ``layer`` itself (its class becomes the original); returns it."""
    if is_kept_fp32(layer):
        layer.__class__ = type(layer).__dict__[_BASE]
    return layer


def select_layers(model: paddle.nn.Layer, names: Iterable[Any]) -> list[paddle.nn.Layer]:
    """Sublayers of ``model`` whose qualified name or class name is in ``names``.

    Raises:
        TypeError: a name that is not a str.
        ValueError: a name that matches nothing (with the closest sublayer names), or one that
            selects ``model`` itself: ``""`` (its own path) or its class name.
    """
    named = dict(model.named_sublayers(include_self=True))
    chosen: list[paddle.nn.Layer] = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"fp32 layer names must be str sublayer paths (e.g. 'head', '2') or class names. "
                            f"Received: {name!r} (of type {type(name).__name__})")
        if name in ("", type(model).__name__):
            what = "the model's own path" if name == "" else "the model's own class"
            children = [qual for qual, _ in model.named_children()][:4]
            raise ValueError(f"fp32 layer name {name!r} is {what}: it would keep the whole model in float32, which "
                             f"is no AMP at all. Name its sublayers by path (e.g. {children}) or class; to keep all "
                             "of it, call keep_fp32(model) without names, or turn AMP off (enable=False).")
        hits = [layer for qual, layer in named.items() if qual == name or type(layer).__name__ == name]
        if not hits:
            pool = sorted(set(named) | {type(v).__name__ for v in named.values()} - {""})
            hint = difflib.get_close_matches(name, pool, n=3)
            more = f" Did you mean {' or '.join(repr(h) for h in hint)}?" if hint else ""
            raise ValueError(f"No sublayer named {name!r} (by path or class) in fp32 layers.{more}")
        chosen.extend(h for h in hits if all(h is not c for c in chosen))
    return chosen


def keep_fp32(layer: paddle.nn.Layer, names: Iterable[str] | str | None = None) -> paddle.nn.Layer:
    """Keep ``layer`` (or the sublayers ``names`` of it) in float32 under AMP.

    In O1 the layer runs with autocast off on float32 inputs; in O2, :func:`decorate` leaves its
    parameters in float32 (call ``keep_fp32`` before ``decorate``). Like Keras'
    ``Dense(10, dtype="float32")`` output layer. Idempotent.

    Args:
        layer: the model (a ``paddle.nn.Layer``).
        names: sublayer names (``"head"``, ``"encoder.norm"``) or layer class names
            (``"LayerNorm"``) to keep; None keeps ``layer`` itself.

    Returns:
        ``layer``, whose selected sublayers now run in float32.

    Raises:
        TypeError: ``layer`` is not a ``paddle.nn.Layer``, or a name is not a str.
        ValueError: a name that matches no sublayer, or ``""`` / ``layer``'s class name (the
            whole layer: pass no names for that).

    Example:
        >>> model = keep_fp32(model, ["head"])  # doctest: +SKIP
    """
    if not isinstance(layer, paddle.nn.Layer):
        raise TypeError(f"keep_fp32 expects a paddle.nn.Layer. Received: {type(layer).__name__}")
    targets = [layer] if names is None else select_layers(layer, [names] if isinstance(names, str) else names)
    for target in targets:
        if not is_kept_fp32(target):
            target.__class__ = kept_class(type(target))
    return layer
