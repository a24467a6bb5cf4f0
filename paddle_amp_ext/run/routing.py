"""Routing ``paddle.amp`` to this package, for code you do not own.

Toolkits (PaddleNLP's Trainer, hapi's ``Model.fit``, the suites' ``tools/train.py``) call
``paddle.amp.GradScaler(...)``, ``paddle.amp.auto_cast(...)`` and ``paddle.amp.decorate(...)``
by attribute. While routed, those attributes (and ``amp_guard``, ``amp_decorate``, ``AmpScaler``)
are this package's: validated op lists, the compute-capability gate, the non-finite guard,
collapse detection and hooks, with no edit to the toolkit. Code that imported the names before
routing (``from paddle.amp import GradScaler`` at import time) keeps Paddle's. A routing's config
applies to those calls as :mod:`._overrides` says: every key it sets (``config.given``) is applied,
``fp32_layers`` too.

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

from .. import autocast, legacy, lrhold, scaler
from ..config import AmpConfig
from . import _autoguard as autoguard
from . import _overrides as overrides

#: The ``paddle.amp`` attributes routing replaces.
ROUTED_NAMES = ("GradScaler", "AmpScaler", "auto_cast", "amp_guard", "decorate", "amp_decorate")

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
        config: the :class:`AmpConfig` applied to the calls (:mod:`._overrides`: the keys it
            sets replace the caller's arguments, op lists are merged, ``fp32_layers`` are kept
            in float32), or None.
        scalers: every GradScaler built through ``paddle.amp`` under this routing (weakly held).
        replacements: what ``paddle.amp``'s names are while routed (the same for every routing).
    """

    def __init__(self, config: Optional[AmpConfig], on_scaler: Optional[Callable[[Any], Any]],
                 hold_lr_on_skip: bool = True, guard_optimizers: bool = True,
                 on_guard: Optional[Callable[[Any], Any]] = None) -> None:
        if config is not None and not isinstance(config, AmpConfig):
            raise TypeError(f"config must be an AmpConfig. Received: {config!r} (of type {type(config).__name__})")
        for name, value in (("on_scaler", on_scaler), ("on_guard", on_guard)):
            if value is not None and not callable(value):
                what = "GradScaler" if name == "on_scaler" else "OptimizerGuard"
                raise TypeError(f"{name} must be a callable taking the new {what}. Received: {name}={value!r}")
        for name, value in (("hold_lr_on_skip", hold_lr_on_skip), ("guard_optimizers", guard_optimizers)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False. Received: {name}={value!r} "
                                f"(of type {type(value).__name__})")
        self.config = config
        self.hold_lr_on_skip, self.guard_optimizers = hold_lr_on_skip, guard_optimizers
        self._on_scaler, self._on_guard = on_scaler, on_guard
        self._scalers: List[weakref.ref] = []
        self._guards: List[weakref.ref] = []
        self._held_before = lrhold.total_held()
        self._thread = threading.get_ident()
        self._first_call = overrides.FirstCall(config.fp32_layers) if config is not None and config.fp32_layers \
            else None
        self.replacements = REPLACEMENTS

    @property
    def scalers(self) -> List[Any]:
        return [s for s in (ref() for ref in self._scalers) if s is not None]

    @property
    def guards(self) -> List[Any]:
        """The :class:`~paddle_amp_ext.OptimizerGuard` put on every optimizer built under this routing
        (``guard_optimizers=True``; weakly held)."""
        return [g for g in (ref() for ref in self._guards) if g is not None]

    @property
    def lr_steps_held(self) -> int:
        """``lr.step()`` calls held since this routing began (``hold_lr_on_skip``; over every
        scheduler of the process, so overlapping routings count each other's)."""
        return lrhold.total_held() - self._held_before

    def _guarded(self, guard: Any) -> None:
        self._guards.append(weakref.ref(guard))
        if self._on_guard is not None:
            self._on_guard(guard)

    def _built(self, new: Any) -> None:
        self._scalers.append(weakref.ref(new))
        if self._on_scaler is not None:
            self._on_scaler(new)

    def _decorate_kwargs(self, args: Any, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        kwargs = overrides.decorate_kwargs(self.config, args, kwargs)
        if self._first_call is not None:
            self._first_call.settle()  # the models are known: the first call's guess is not needed
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
            if self.hold_lr_on_skip:
                lrhold.deactivate()
            if self.guard_optimizers:
                autoguard.uninstall(self)
            if self._first_call is not None:
                self._first_call.uninstall()
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


def _build_scaler(new: Any, init: Callable[..., None], args: tuple, kwargs: Dict[str, Any]) -> None:
    routing = _current()  # None: the class was kept and called after the last undo
    if routing is None:
        init(*args, **kwargs)
        return
    init(**overrides.scaler_kwargs(routing.config, args, kwargs))
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
    routing = _current()
    if routing is None:
        return autocast.auto_cast(*args, **kwargs)
    return autocast.auto_cast(**overrides.cast_kwargs(routing.config, args, kwargs))


def _decorate(*args: Any, **kwargs: Any) -> Any:
    routing = _current()
    if routing is None:
        return autocast.decorate(*args, **kwargs)
    return autocast.decorate(**routing._decorate_kwargs(args, kwargs))


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


def route(config: Optional[AmpConfig] = None, *, on_scaler: Optional[Callable[[Any], Any]] = None,
          hold_lr_on_skip: bool = True, guard_optimizers: bool = True,
          on_guard: Optional[Callable[[Any], Any]] = None) -> Routing:
    """Make ``paddle.amp.GradScaler``, ``auto_cast`` and ``decorate`` be this package's; reversible.

    Safe across threads: each routing counts, and ``paddle.amp`` is restored when the last one
    is undone, in whatever order (see :class:`Routing` for which config a call uses).

    Args:
        config: an :class:`AmpConfig` applied to the calls: every key it sets
            (``config.given``) replaces the caller's argument (op lists merged, ``fp32_layers``
            kept in float32; see :mod:`paddle_amp_ext.run._overrides`).
        on_scaler: called with every GradScaler built while routed (e.g. to add hooks).
        hold_lr_on_skip: an LR scheduler bound to an optimizer whose last step was skipped does
            not advance on the loop's own ``lr.step()``, once per skipped step (default True;
            see :mod:`paddle_amp_ext.lrhold` for the exact rule; counted in
            :attr:`Routing.lr_steps_held`).
        guard_optimizers: guard every optimizer built while routed, so a step without a
            GradScaler (bf16/fp32 loops, the Trainers' bf16 path) skips inf/nan gradients
            (default True; one host sync per such step; a scaler-stepped optimizer is judged by
            its scaler only; see :mod:`paddle_amp_ext.run._autoguard`).
        on_guard: called with every such :class:`~paddle_amp_ext.OptimizerGuard` (e.g. to add hooks).

    Returns:
        The :class:`Routing`; ``routing.undo()`` (or :func:`unroute`) ends it.

    Raises:
        TypeError: ``config`` is not an :class:`AmpConfig`, or ``on_scaler`` is not callable.

    Example:
        >>> routing = route()  # doctest: +SKIP
        >>> trainer = Trainer(args=TrainingArguments(fp16=True, ...), ...)  # builds our scaler
    """
    routing = Routing(config, on_scaler, hold_lr_on_skip, guard_optimizers, on_guard)
    with _lock:
        if not _active:
            _install()
        _active.append(routing)
        if hold_lr_on_skip:
            lrhold.activate()
        if guard_optimizers:
            autoguard.install(routing, _current)
        if routing._first_call is not None:
            routing._first_call.install()
    return routing


def unroute() -> None:
    """Undo the calling thread's innermost :func:`route`, else the last one (nothing to do when none is active)."""
    current = active_routing()
    if current is not None:
        current.undo()


def active_routing() -> Optional[Routing]:
    """The routing a ``paddle.amp`` call from this thread uses now (see :class:`Routing`).

    Returns:
        The :class:`Routing`, or None when ``paddle.amp`` is Paddle's own.
    """
    return _current()


@contextlib.contextmanager
def routed(config: Optional[AmpConfig] = None, *, on_scaler: Optional[Callable[[Any], Any]] = None,
           hold_lr_on_skip: bool = True, guard_optimizers: bool = True,
           on_guard: Optional[Callable[[Any], Any]] = None) -> Iterator[Routing]:
    """:func:`route` for the duration of a ``with`` block.

    Args:
        config: as for :func:`route`.
        on_scaler: as for :func:`route`.
        hold_lr_on_skip: as for :func:`route`.
        guard_optimizers: as for :func:`route`.
        on_guard: as for :func:`route`.

    Returns:
        A context manager yielding the :class:`Routing`, undone when the block ends (however
        it ends).

    Raises:
        TypeError: as for :func:`route`.

    Example:
        >>> with routed(AmpConfig(dtype="float16")) as routing:  # doctest: +SKIP
        ...     model.fit(data)                                  # hapi's GradScaler is ours
    """
    routing = route(config, on_scaler=on_scaler, hold_lr_on_skip=hold_lr_on_skip,
                    guard_optimizers=guard_optimizers, on_guard=on_guard)
    try:
        yield routing
    finally:
        routing.undo()
