"""While routed, every optimizer built is guarded: a step without a scaler skips inf/nan gradients.

bfloat16 and float32 loops (and the Trainers' bf16 path, which calls ``optimizer.step()``
without a scaler) have no loss scaler to skip an inf/nan step, so one NaN gradient reaches every
weight. While a routing with ``guard_optimizers=True`` (the default) is active,
the ``__init__`` of ``paddle.optimizer.Optimizer`` and of every subclass defined so far is
wrapped (``AdamW`` does not call ``Optimizer.__init__``): every optimizer built then is guarded
with :func:`paddle_amp_ext.guard_optimizer` once its own ``__init__`` has run, with the routing
config's ``max_consecutive_skips`` and ``on_collapse``, when the routing that applies to the
calling thread (as for ``paddle.amp``'s calls) guards: a nested ``routed(guard_optimizers=False)``
builds unguarded optimizers inside a guarding one. A subclass defined later is covered when
its ``__init__`` calls its base's. The script's own ``guard_optimizer(optimizer, ...)`` on such
an optimizer wins: the routing's guard takes its settings and is its guard from then on (no
"already guarded" error; the routing's hooks stay).

fleet's wrappers are guarded too (``MixPrecisionOptimizer``, ``HybridParallelOptimizer``): the
Trainers' ``amp_master_grad`` step is ``MixPrecisionOptimizer.step``, which never calls its inner
optimizer's. No double guard: when a :class:`~paddle_amp_ext.GradScaler` steps the optimizer
(``step``, ``minimize``), or a guard on a wrapper calls its inner optimizer, the gradients have
been judged and the inner guard passes the call through (no second norm, no second sync, no
event). Only an optimizer stepped on its own is judged by the
guard: one fused norm per gradient and one host read per step, the one loss scaling costs
(Paddle's ``found_inf`` auxiliary variable would not save it in dygraph: see
``benchmarks/guard_syncs.py``). Optimizers built before routing, and in a static program, are
left alone; the wrap is undone when the last guarding routing ends (the guards stay on their
optimizers, as :func:`guard_optimizer` leaves them).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

import paddle

from .. import _compat
from .._log import info_once
from ..guard import OptimizerGuard, guard_of

_lock = threading.Lock()
_users: List[Any] = []  # the routings that guard, oldest first
_originals: Dict[type, Callable[..., None]] = {}  # each wrapped class's own __init__
_wrappers: Dict[type, Callable[..., None]] = {}
_current: Optional[Callable[[], Any]] = None  # routing's "which routing applies to this call"


def _guard_new(optimizer: Any) -> None:
    with _lock:
        current = _current
    routing = current() if current is not None else None  # the calling thread's routing, as paddle.amp's calls
    if routing is None or not routing.guard_optimizers or _compat.in_static_mode() \
            or guard_of(optimizer) is not None:
        return
    config = routing.config
    guard = OptimizerGuard(optimizer, (), None if config is None else config.max_consecutive_skips,
                           "warn" if config is None else config.on_collapse, defer_to_scaler=True)
    info_once("autoguard", "paddle_amp_ext routing guards %s: a step without a GradScaler whose gradients hold "
              "inf/nan is skipped (guard_optimizers=False turns this off).", type(optimizer).__name__)
    routing._guarded(guard)


def _classes() -> List[type]:
    """``paddle.optimizer.Optimizer`` and every subclass defined so far that has its own ``__init__``
    (``AdamW`` does not call ``Optimizer.__init__``, so the base alone is not enough), and fleet's
    wrappers (``MixPrecisionOptimizer``: the Trainers' ``amp_master_grad`` optimizer, whose
    ``step`` never calls the inner optimizer's)."""
    found, todo = [], [paddle.optimizer.Optimizer]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        todo.extend(cls.__subclasses__())
    found += [cls for cls in _compat.optimizer_wrapper_classes() if cls not in found]
    return [cls for cls in found if "__init__" in vars(cls)]


def _wrap(cls: type) -> Callable[..., None]:
    original = vars(cls)["__init__"]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, *args, **kwargs)
        if type(self) is cls or not _has_own_init_below(type(self), cls):
            _guard_new(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__qualname__ = getattr(original, "__qualname__", "__init__")
    _originals[cls] = original
    return __init__


def _has_own_init_below(cls: type, base: type) -> bool:
    """Whether a class between ``cls`` and ``base`` in the MRO has a wrapped ``__init__`` (it guards then)."""
    for klass in cls.__mro__:
        if klass is base:
            return False
        if klass in _wrappers:
            return True
    return False


def install(routing: Any, current: Callable[[], Any]) -> None:
    """Guard the optimizers built from now on for ``routing`` (wraps the ``__init__`` of
    ``Optimizer`` and of its subclasses once, for every guarding routing).

    Args:
        routing: the routing that guards.
        current: returns the routing that applies to a call from the calling thread (its
            innermost, else the last entered); an optimizer is guarded when that one guards.
    """
    global _current
    with _lock:
        _users.append(routing)
        _current = current
        if _wrappers:
            return
        for cls in _classes():
            _wrappers[cls] = _wrap(cls)
            cls.__init__ = _wrappers[cls]  # type: ignore[misc]


def uninstall(routing: Any) -> None:
    """Stop guarding for ``routing``; the last one puts every ``__init__`` back (where nothing
    replaced it since)."""
    global _current
    with _lock:
        _users[:] = [user for user in _users if user is not routing]
        if _users:
            return
        for cls, wrapper in _wrappers.items():
            if vars(cls).get("__init__") is wrapper:
                cls.__init__ = _originals[cls]  # type: ignore[misc]
        _originals.clear()
        _wrappers.clear()
        _current = None
