"""Holding an LR scheduler on a skipped step: the loop's own ``lr.step()`` after it does not advance it.

PaddleSeg and PaddleDetection call ``lr.step()`` themselves after every ``scaler.minimize()``;
without a hold, every skipped step (an fp16 overflow, an inf/nan gradient) still advances the
schedule (PaddleDetection spent its whole warmup on skipped steps). accelerate's
``AcceleratedScheduler`` holds a scheduler whose optimizer step was skipped; this module does the
same for schedulers the loop steps itself, with no change to the loop. It is active while
:func:`paddle_amp_ext.routed` / :func:`~paddle_amp_ext.route` / ``python -m paddle_amp_ext.run``
is (unless ``hold_lr_on_skip=False``); :func:`activate` / :func:`deactivate` count.

The rule, exactly:

- A scheduler is *bound* to an optimizer built with it (``learning_rate=scheduler``; fleet's
  wrappers are followed to their inner optimizer).
- Every step a :class:`~paddle_amp_ext.GradScaler` (``step``, ``minimize``) or an optimizer guard
  decides is noted for that optimizer: a skipped step marks its bound scheduler, an applied one
  removes that optimizer's mark.
- While marked, the scheduler's next ``step()`` with an implicit epoch (``step()``,
  ``ReduceOnPlateau.step(metrics)``) is swallowed: ``last_epoch`` and ``last_lr`` stay as they
  were, the mark is cleared, the hold is counted (:func:`held_steps`, :func:`total_held`) and
  logged once. One skipped step holds at most one ``lr.step()``.
- An explicit ``step(epoch)`` (or ``ReduceOnPlateau.step(metrics, epoch)``) is never swallowed:
  the caller says where the schedule is; it clears the mark.
- A scheduler shared by several optimizers is held when any of them skipped its last step.
- No double hold: a Trainer that holds on its own (PaddleNLP/PaddleFormers read
  ``_cache_found_inf`` and do not call ``lr.step()`` after a skip), ``GradScaler.step_scheduler``
  and ``AmpCallback``'s hold all leave the mark to be cleared by the next applied step.
- A per-epoch schedule (hapi's ``LRScheduler(by_epoch=True)``) is held when the epoch's last step
  was skipped, as accelerate's is.

The hold replaces ``step`` on the scheduler object (an instance attribute, so ``ReduceOnPlateau``
and any subclass are covered; bound to the scheduler, so ``copy.deepcopy`` of a scheduler holds
the copy), the first time one of its optimizers steps while active; the original is put back
when the last activation ends (a copy, or a scheduler something wrapped since, keeps a hold that
passes through). Costs no device work and no host sync.
"""

from __future__ import annotations

import inspect
import threading
import types
import weakref
from typing import Any, Optional

from . import _compat
from ._log import warn_once

_ATTR = "_paddle_amp_ext_held_step"  # where a scheduler keeps its hold (no strong reference from here)

_lock = threading.RLock()
_active = 0
_total = 0
_schedulers: weakref.WeakSet[Any] = weakref.WeakSet()


class _Hold:
    """A scheduler's hold, kept in the scheduler's own ``__dict__`` (it deep-copies with it)."""

    def __init__(self, scheduler: Any) -> None:
        self.previous = vars(scheduler).get("step")  # an instance attribute it replaces, if any
        self.signature = _signature(type(scheduler).step)
        self.pending: set = set()  # ids of the bound optimizers whose last step was skipped
        self.held = 0
        self.method: Any = None  # the bound step put on the scheduler


def _held_step(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """What ``scheduler.step`` is while held (bound to the scheduler, so a copy of the scheduler
    is bound to the copy); passes through once no hold is active."""
    global _total
    hold = vars(scheduler)[_ATTR]
    with _lock:
        swallow = False
        if _active and hold.pending:
            implicit = _implicit_epoch(hold.signature, scheduler, args, kwargs)
            if implicit is not None:  # a call that would not bind goes through (and raises there)
                hold.pending.clear()
                swallow = implicit
        if swallow:
            hold.held += 1
            _total += 1
    if swallow:
        warn_once(f"lrhold:{id(scheduler)}", "%s.step() held: the step of its optimizer was skipped "
                  "(inf/nan gradients), so the schedule does not advance on it (once per skipped step; "
                  "hold_lr_on_skip=False turns this off).", type(scheduler).__name__)
        return None
    if hold.previous is not None:
        return hold.previous(*args, **kwargs)
    return type(scheduler).step(scheduler, *args, **kwargs)


def _signature(function: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _implicit_epoch(signature: Optional[inspect.Signature], scheduler: Any, args: tuple, kwargs: dict
                    ) -> Optional[bool]:
    """True for a ``step`` call without an explicit epoch, False with one, None if it would not bind."""
    if signature is None:
        return True
    try:
        bound = signature.bind(scheduler, *args, **kwargs)
    except TypeError:
        return None
    return bound.arguments.get("epoch") is None


def _hold_of(scheduler: Any) -> _Hold:
    hold = vars(scheduler).get(_ATTR)
    if hold is None:
        hold = _Hold(scheduler)
        setattr(scheduler, _ATTR, hold)
        hold.method = scheduler.step = types.MethodType(_held_step, scheduler)
    _schedulers.add(scheduler)
    return hold


def note_step(optimizer: Any, skipped: bool) -> None:
    """Note that ``optimizer``'s step was decided (``skipped`` or applied); no-op while inactive.

    Called by the scaler and the guard after every step decision. No device work.
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
    """End one :func:`activate`; at the last, every scheduler gets its own ``step`` back.

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
        for scheduler in list(_schedulers):
            hold = vars(scheduler).get(_ATTR)
            if hold is None:
                continue
            hold.pending.clear()
            if vars(scheduler).get("step") is hold.method:  # else something wrapped it since: ours passes through
                del vars(scheduler)[_ATTR]
                if hold.previous is None:
                    del scheduler.step
                else:
                    scheduler.step = hold.previous
        _schedulers.clear()


def is_active() -> bool:
    """Whether schedulers are being held now."""
    return _active > 0


def held_steps(scheduler: Any) -> int:
    """How many of ``scheduler``'s ``step()`` calls were held during the current activation (0 if none)."""
    hold = vars(scheduler).get(_ATTR) if hasattr(scheduler, "__dict__") else None
    return 0 if hold is None else hold.held


def total_held() -> int:
    """How many ``lr.step()`` calls were held in this process, over every scheduler (host int)."""
    return _total
