"""Routing ``paddle.amp`` to this package, for code you do not own.

Toolkits (PaddleNLP's Trainer, hapi's ``Model.fit``, the suites' ``tools/train.py``) call
``paddle.amp.GradScaler(...)``, ``paddle.amp.auto_cast(...)`` and ``paddle.amp.decorate(...)``
by attribute. While routed, those attributes (and ``amp_guard``, ``amp_decorate``, ``AmpScaler``)
are this package's: validated op lists, the compute-capability gate, the non-finite guard,
collapse detection and hooks, with no edit to the toolkit. Code that imported the names before
routing (``from paddle.amp import GradScaler`` at import time) keeps Paddle's. A routing's config
applies to those calls as :mod:`.overrides` says: every key it sets (``config.given``) is applied,
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

from .. import autocast, legacy, scaler
from ..config import AmpConfig
from . import overrides

#: The ``paddle.amp`` attributes routing replaces.
ROUTED_NAMES = ("GradScaler", "AmpScaler", "auto_cast", "amp_guard", "decorate", "amp_decorate")

_lock = threading.Lock()
_stack: List[Routing] = []


class Routing:
    """One active routing: the config it applies and the scalers built while it is active.

    Attributes:
        config: the :class:`AmpConfig` applied to the calls (:mod:`.overrides`: the keys it
            sets replace the caller's arguments, op lists are merged, ``fp32_layers`` are kept
            in float32), or None.
        scalers: every GradScaler built through ``paddle.amp`` while routed (weakly held).
    """

    def __init__(self, config: Optional[AmpConfig], on_scaler: Optional[Callable[[Any], Any]]) -> None:
        if config is not None and not isinstance(config, AmpConfig):
            raise TypeError(f"config must be an AmpConfig. Received: {config!r} (of type {type(config).__name__})")
        if on_scaler is not None and not callable(on_scaler):
            raise TypeError(f"on_scaler must be a callable taking the new GradScaler. Received: {on_scaler!r}")
        self.config = config
        self._on_scaler = on_scaler
        self._scalers: List[weakref.ref] = []
        self._saved: Dict[str, Any] = {}
        self._first_call = overrides.FirstCall(config.fp32_layers) if config is not None and config.fp32_layers \
            else None
        self.replacements = self._build()

    @property
    def scalers(self) -> List[Any]:
        return [s for s in (ref() for ref in self._scalers) if s is not None]

    def _built(self, new: Any) -> None:
        self._scalers.append(weakref.ref(new))
        if self._on_scaler is not None:
            self._on_scaler(new)

    def _decorate_kwargs(self, args: Any, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        kwargs = overrides.decorate_kwargs(self.config, args, kwargs)
        if self._first_call is not None:
            self._first_call.done = True  # the models are known: the first call's guess is not needed
        return kwargs

    def _build(self) -> Dict[str, Any]:
        routing, config = self, self.config

        class GradScaler(scaler.GradScaler):
            """``paddle_amp_ext.GradScaler``, as ``paddle.amp.GradScaler`` while routed."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(**overrides.scaler_kwargs(config, args, kwargs))
                routing._built(self)

        class AmpScaler(legacy.AmpScaler):
            """``paddle_amp_ext.AmpScaler``, as ``paddle.amp.AmpScaler`` while routed."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(**overrides.scaler_kwargs(config, args, kwargs))
                routing._built(self)

        def auto_cast(*args: Any, **kwargs: Any) -> Any:
            return autocast.auto_cast(**overrides.cast_kwargs(config, args, kwargs))

        def decorate(*args: Any, **kwargs: Any) -> Any:
            return autocast.decorate(**routing._decorate_kwargs(args, kwargs))

        for replacement, original in ((GradScaler, scaler.GradScaler), (AmpScaler, legacy.AmpScaler)):
            replacement.__module__, replacement.__qualname__ = original.__module__, original.__qualname__
        for fn, original in ((auto_cast, autocast.auto_cast), (decorate, autocast.decorate)):
            fn.__doc__, fn.__name__ = original.__doc__, original.__name__
            fn.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.signature shows Paddle's
        return {"GradScaler": GradScaler, "AmpScaler": AmpScaler, "auto_cast": auto_cast, "amp_guard": auto_cast,
                "decorate": decorate, "amp_decorate": decorate}

    # ------------------------------------------------------------------ install / undo
    def _install(self) -> None:
        for name in ROUTED_NAMES:
            self._saved[name] = getattr(paddle.amp, name, None)
            setattr(paddle.amp, name, self.replacements[name])
        if self._first_call is not None:
            self._first_call.install()

    def _restore(self) -> None:
        if self._first_call is not None:
            self._first_call.uninstall()
        for name, value in self._saved.items():
            if value is None:
                delattr(paddle.amp, name)
            else:
                setattr(paddle.amp, name, value)

    def undo(self) -> None:
        """Restore what ``paddle.amp`` held before this routing (the innermost one only)."""
        with _lock:
            if not _stack or _stack[-1] is not self:
                raise RuntimeError("Only the innermost routing can be undone: undo routings in reverse order.")
            _stack.pop()
            self._restore()

    def __enter__(self) -> Routing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def route(config: Optional[AmpConfig] = None, *, on_scaler: Optional[Callable[[Any], Any]] = None) -> Routing:
    """Make ``paddle.amp.GradScaler``, ``auto_cast`` and ``decorate`` be this package's; reversible.

    Args:
        config: an :class:`AmpConfig` applied to the calls: every key it sets
            (``config.given``) replaces the caller's argument (op lists merged, ``fp32_layers``
            kept in float32; see :mod:`paddle_amp_ext.integrations.overrides`).
        on_scaler: called with every GradScaler built while routed (e.g. to add hooks).

    Returns:
        The :class:`Routing`; ``routing.undo()`` (or :func:`unroute`) restores ``paddle.amp``.

    Example:
        >>> routing = route()  # doctest: +SKIP
        >>> trainer = Trainer(args=TrainingArguments(fp16=True, ...), ...)  # builds our scaler
    """
    routing = Routing(config, on_scaler)
    with _lock:
        routing._install()
        _stack.append(routing)
    return routing


def unroute() -> None:
    """Undo the innermost :func:`route` (nothing to do when none is active)."""
    current = active_routing()
    if current is not None:
        current.undo()


def active_routing() -> Optional[Routing]:
    """The innermost active routing, or None."""
    with _lock:
        return _stack[-1] if _stack else None


@contextlib.contextmanager
def routed(config: Optional[AmpConfig] = None, *, on_scaler: Optional[Callable[[Any], Any]] = None
           ) -> Iterator[Routing]:
    """:func:`route` for the duration of a ``with`` block."""
    routing = route(config, on_scaler=on_scaler)
    try:
        yield routing
    finally:
        routing.undo()
