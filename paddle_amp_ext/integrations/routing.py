"""Routing ``paddle.amp`` to this package, for code you do not own.

Toolkits (PaddleNLP's Trainer, hapi's ``Model.fit``, the suites' ``tools/train.py``) call
``paddle.amp.GradScaler(...)``, ``paddle.amp.auto_cast(...)`` and ``paddle.amp.decorate(...)``
by attribute. While routed, those attributes (and ``amp_guard``, ``amp_decorate``, ``AmpScaler``)
are this package's: validated op lists, the compute-capability gate, the non-finite guard,
collapse detection and hooks, with no edit to the toolkit. Code that imported the names before
routing (``from paddle.amp import GradScaler`` at import time) keeps Paddle's.

Example:
    >>> import paddle_amp_ext as amp
    >>> with amp.routed(on_scaler=lambda s: s.add_hook(amp.VisualDLHook("runs"))):  # doctest: +SKIP
    ...     trainer.train()
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional

import paddle

from .. import autocast, legacy, scaler
from ..config import AmpConfig

#: The ``paddle.amp`` attributes routing replaces.
ROUTED_NAMES = ("GradScaler", "AmpScaler", "auto_cast", "amp_guard", "decorate", "amp_decorate")
#: Our GradScaler keywords a config fills in when the caller did not pass them.
_SCALER_EXTRAS = ("min_loss_scaling", "max_loss_scaling", "hysteresis", "max_consecutive_skips", "on_collapse")

_lock = threading.Lock()
_active: List[Routing] = []  # every routing not yet undone, oldest first
_saved: Dict[str, Any] = {}  # what paddle.amp held before the first of them


class Routing:
    """One active routing: the config it applies and the scalers built while it is active.

    Routings may overlap in any order, in one thread or many: ``paddle.amp`` stays routed while
    any is active and is restored when the last is undone. A call through ``paddle.amp`` uses
    the calling thread's innermost routing, else (a thread started inside a ``routed`` block)
    the one entered last.

    Attributes:
        config: the :class:`AmpConfig` whose op lists, dtype, level and scaler extras fill in
            what the caller leaves at Paddle's defaults (explicit arguments win), or None.
        scalers: every GradScaler built through ``paddle.amp`` under this routing (weakly held).
        replacements: what ``paddle.amp``'s names are while routed (the same for every routing).
    """

    def __init__(self, config: Optional[AmpConfig], on_scaler: Optional[Callable[[Any], Any]]) -> None:
        if config is not None and not isinstance(config, AmpConfig):
            raise TypeError(f"config must be an AmpConfig. Received: {config!r} (of type {type(config).__name__})")
        if on_scaler is not None and not callable(on_scaler):
            raise TypeError(f"on_scaler must be a callable taking the new GradScaler. Received: {on_scaler!r}")
        self.config = config
        self._on_scaler = on_scaler
        self._scalers: List[weakref.ref] = []
        self._thread = threading.get_ident()
        self.replacements = REPLACEMENTS

    @property
    def scalers(self) -> List[Any]:
        return [s for s in (ref() for ref in self._scalers) if s is not None]

    def _built(self, new: Any) -> None:
        self._scalers.append(weakref.ref(new))
        if self._on_scaler is not None:
            self._on_scaler(new)

    def _scaler_kwargs(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        if self.config is not None:
            for key in _SCALER_EXTRAS:
                kwargs.setdefault(key, getattr(self.config, key))
        return kwargs

    def _cast_kwargs(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        cfg = self.config
        if cfg is not None:
            if kwargs.get("custom_white_list") is None and cfg.custom_white_list:
                kwargs["custom_white_list"] = cfg.custom_white_list
            if kwargs.get("custom_black_list") is None and cfg.custom_black_list:
                kwargs["custom_black_list"] = cfg.custom_black_list
            if kwargs.get("dtype", "float16") == "float16":
                kwargs["dtype"] = cfg.dtype
        return kwargs

    def undo(self) -> None:
        """End this routing; ``paddle.amp`` gets back what it held once no routing is active.

        Raises:
            RuntimeError: this routing was undone already.
        """
        with _lock:
            if not any(active is self for active in _active):
                raise RuntimeError("This routing was undone already (a second undo(), or unroute() after the "
                                   "`with routed()` block ended it): undo each routing once.")
            _active[:] = [active for active in _active if active is not self]
            if not _active:
                _restore()

    def __enter__(self) -> Routing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def _current() -> Optional[Routing]:
    """The calling thread's innermost active routing, else the one entered last, else None."""
    with _lock:
        mine = [active for active in _active if active._thread == threading.get_ident()]
        return (mine or _active or [None])[-1]


_CAST_NAMES = ("enable", "custom_white_list", "custom_black_list", "level", "dtype", "use_promote")


def _build_scaler(new: Any, init: Callable[..., None], args: tuple, kwargs: Dict[str, Any]) -> None:
    routing = _current()  # None: the class was kept and called after the last undo
    init(*args, **(kwargs if routing is None else routing._scaler_kwargs(kwargs)))
    if routing is not None:
        routing._built(new)


class _GradScaler(scaler.GradScaler):
    """``paddle_amp_ext.GradScaler``, as ``paddle.amp.GradScaler`` while routed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _build_scaler(self, super().__init__, args, kwargs)


class _AmpScaler(legacy.AmpScaler):
    """``paddle_amp_ext.AmpScaler``, as ``paddle.amp.AmpScaler`` while routed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _build_scaler(self, super().__init__, args, kwargs)


def _auto_cast(*args: Any, **kwargs: Any) -> Any:
    kwargs.update(zip(_CAST_NAMES, args))
    routing = _current()
    return autocast.auto_cast(**(kwargs if routing is None else routing._cast_kwargs(kwargs)))


def _decorate(*args: Any, **kwargs: Any) -> Any:
    return autocast.decorate(*args, **kwargs)


for _replacement, _original in ((_GradScaler, scaler.GradScaler), (_AmpScaler, legacy.AmpScaler)):
    _replacement.__module__, _replacement.__qualname__ = _original.__module__, _original.__qualname__
    _replacement.__name__ = _original.__name__
for _fn, _original in ((_auto_cast, autocast.auto_cast), (_decorate, autocast.decorate)):
    _fn.__doc__, _fn.__name__ = _original.__doc__, _original.__name__
    _fn.__wrapped__ = _original  # type: ignore[attr-defined]  # inspect.signature shows Paddle's

#: What ``paddle.amp``'s names are while any routing is active.
REPLACEMENTS: Dict[str, Any] = {"GradScaler": _GradScaler, "AmpScaler": _AmpScaler, "auto_cast": _auto_cast,
                                "amp_guard": _auto_cast, "decorate": _decorate, "amp_decorate": _decorate}


def _install() -> None:
    for name in ROUTED_NAMES:
        _saved[name] = getattr(paddle.amp, name, None)
        setattr(paddle.amp, name, REPLACEMENTS[name])


def _restore() -> None:
    for name, value in _saved.items():
        if value is None:
            delattr(paddle.amp, name)
        else:
            setattr(paddle.amp, name, value)
    _saved.clear()


def route(config: Optional[AmpConfig] = None, *, on_scaler: Optional[Callable[[Any], Any]] = None) -> Routing:
    """Make ``paddle.amp.GradScaler``, ``auto_cast`` and ``decorate`` be this package's; reversible.

    Safe across threads: each routing counts, and ``paddle.amp`` is restored when the last one
    is undone, in whatever order (see :class:`Routing` for which config a call uses).

    Args:
        config: an :class:`AmpConfig` filling in op lists, dtype and scaler extras
            (``max_consecutive_skips``, bounds, ...) where the caller passes Paddle's defaults.
        on_scaler: called with every GradScaler built while routed (e.g. to add hooks).

    Returns:
        The :class:`Routing`; ``routing.undo()`` (or :func:`unroute`) ends it.

    Example:
        >>> routing = route()  # doctest: +SKIP
        >>> trainer = Trainer(args=TrainingArguments(fp16=True, ...), ...)  # builds our scaler
    """
    routing = Routing(config, on_scaler)
    with _lock:
        if not _active:
            _install()
        _active.append(routing)
    return routing


def unroute() -> None:
    """Undo the calling thread's innermost :func:`route`, else the last one (nothing to do when none is active)."""
    current = active_routing()
    if current is not None:
        current.undo()


def active_routing() -> Optional[Routing]:
    """The routing a ``paddle.amp`` call from this thread uses now (see :class:`Routing`), or None."""
    return _current()


@contextlib.contextmanager
def routed(config: Optional[AmpConfig] = None, *, on_scaler: Optional[Callable[[Any], Any]] = None
           ) -> Iterator[Routing]:
    """:func:`route` for the duration of a ``with`` block."""
    routing = route(config, on_scaler=on_scaler)
    try:
        yield routing
    finally:
        routing.undo()
