"""Holding an LR scheduler on a skipped step: the loop's own ``lr.step()`` after it does not advance it.

A scheduler bound to an optimizer (``learning_rate=scheduler``) is marked when a scaler or guard
skips that optimizer's step; its next implicit-epoch ``step()`` is then swallowed (counted,
logged once); an explicit ``step(epoch)`` never is, and an applied step clears the mark. Active
while a routing is, and while ``AmpCallback`` guards a Trainer's training (:func:`activate` /
:func:`deactivate` count). The hold wraps ``step`` on the
scheduler's class and keeps its marks here, weakly: nothing is put on the scheduler object. No
device work, no host sync. The full rule: "Notes for maintainers" in the docs.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

from . import _compat
from ._log import warn_once

_MARK = "_paddle_amp_ext_lr_hold"  # set on the step functions this module puts on classes
_MISSING = object()

_lock = threading.RLock()
_active = 0
_total = 0
_holds: Dict[int, Tuple[Any, _Hold]] = {}  # id(scheduler) -> (weakref to it, its hold)
_patched: Dict[type, Tuple[Any, Any]] = {}  # class -> (its own step before, or _MISSING; ours)


class _Hold:
    """A scheduler's marks: the bound optimizers whose last step was skipped, and the holds made."""

    def __init__(self) -> None:
        self.pending: set = set()  # ids of the bound optimizers whose last step was skipped
        self.held = 0


def _hold_for(scheduler: Any) -> Optional[_Hold]:
    entry = _holds.get(id(scheduler))
    return entry[1] if entry is not None and entry[0]() is scheduler else None


def _swallows(scheduler: Any, signature: Optional[inspect.Signature], args: tuple, kwargs: dict) -> bool:
    """Whether this ``step`` call is held (and if so count it); clears the mark on a call that binds."""
    global _total
    with _lock:
        hold = _hold_for(scheduler) if _active else None
        if hold is None or not hold.pending:
            return False
        implicit = _implicit_epoch(signature, scheduler, args, kwargs)
        if implicit is None:  # a call that would not bind goes through (and raises there); the mark stays
            return False
        hold.pending.clear()
        if not implicit:
            return False
        hold.held += 1
        _total += 1
    warn_once(f"lrhold:{id(scheduler)}", "%s.step() held: the step of its optimizer was skipped "
              "(inf/nan gradients), so the schedule does not advance on it (once per skipped step; "
              "a routing's hold_lr_on_skip=False turns this off).", type(scheduler).__name__)
    return True


def _held(original: Any) -> Any:
    """``original`` (a class's ``step``) wrapped: a held call returns None, any other goes through."""
    signature = _signature(original)

    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _active and _swallows(self, signature, args, kwargs):
            return None
        return original(self, *args, **kwargs)

    setattr(step, _MARK, True)
    return step


def _signature(function: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _implicit_epoch(signature: Optional[inspect.Signature], scheduler: Any, args: tuple, kwargs: dict
                    ) -> Optional[bool]:
    """True for a ``step`` call with no argument beyond the required ones (or only defaults), False
    with one, None if it would not bind."""
    if signature is None:
        return not args and not kwargs
    try:
        bound = signature.bind(scheduler, *args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
        param = signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            if value:
                return False
        elif param.default is not param.empty and value is not param.default:
            return False
    return True


def _wrap_class_step(cls: type) -> None:
    """Put the hold on the ``step`` instances of ``cls`` run, unless it is ours already (here or on a base)."""
    current = getattr(cls, "step", None)
    if getattr(current, _MARK, False):
        return
    previous = vars(cls).get("step", _MISSING)
    try:
        if not inspect.isfunction(current):
            raise TypeError(f"not a function: {current!r}")
        ours = _held(current)
        cls.step = ours
    except (TypeError, AttributeError) as exc:  # a class that refuses new attributes, a step that is no function
        warn_once(f"lrhold:class:{id(cls)}", "%s.step cannot be wrapped (%s), so its schedule is not held on "
                  "skipped steps.", cls.__name__, exc)
        return
    _patched[cls] = (previous, ours)


def _hold_of(scheduler: Any) -> _Hold:
    hold = _hold_for(scheduler)
    if hold is None:
        hold = _Hold()
        key = id(scheduler)
        _holds[key] = (weakref.ref(scheduler, lambda _ref, key=key: _forget(key, _ref)), hold)
        _wrap_class_step(type(scheduler))
    return hold


def _forget(key: int, ref: Any) -> None:
    with _lock:
        entry = _holds.get(key)
        if entry is not None and entry[0] is ref:
            del _holds[key]


def note_step(optimizer: Any, skipped: bool) -> None:
    """Note that ``optimizer``'s step was decided (``skipped`` or applied); no-op while inactive.

    Called by the scaler after every step decision (``step``, ``minimize``), and so by the
    optimizer guard, whose decision is its scaler's step. No device work: ``skipped`` is the host
    bool the step already read.
    """
    if not _active:
        return
    scheduler = _compat.bound_scheduler(optimizer)
    if scheduler is None:
        return
    with _lock:
        if not _active:
            return
        hold = _hold_of(scheduler)
        hold.pending.discard(id(optimizer))
        if skipped:
            hold.pending.add(id(optimizer))


def activate() -> None:
    """Start holding (counted: the hold stays active until every :func:`activate` is matched)."""
    global _active
    with _lock:
        _active += 1


def deactivate() -> None:
    """End one :func:`activate`; at the last, every scheduler class gets its own ``step`` back.

    Raises:
        RuntimeError: more deactivations than activations.
    """
    global _active
    with _lock:
        if _active <= 0:
            raise RuntimeError("lrhold.deactivate() without a matching activate().")
        _active -= 1
        if _active:
            return
        _holds.clear()
        for cls, (previous, ours) in list(_patched.items()):
            if vars(cls).get("step") is ours:  # else something put its own since: ours passes through
                if previous is _MISSING:
                    delattr(cls, "step")
                else:
                    cls.step = previous
        _patched.clear()


def is_active() -> bool:
    """Whether schedulers are being held now."""
    return _active > 0


def held_steps(scheduler: Any) -> int:
    """How many of ``scheduler``'s ``step()`` calls were held during the current activation (0 if none)."""
    with _lock:
        hold = _hold_for(scheduler)
    return 0 if hold is None else hold.held


def total_held() -> int:
    """How many ``lr.step()`` calls were held in this process, over every scheduler (host int)."""
    return _total
