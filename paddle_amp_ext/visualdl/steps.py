"""A hook's steps: the scaler's events waiting for the next flush, and the rows they become.

The training thread only appends ``(event, walltime_ms, extra_rows)`` to :class:`PendingSteps`
(one deque append a step). Whichever flush comes next (the training thread's every
``flush_every`` steps, the background flusher's, a signal's, close's) turns the waiting events
into rows, in order, and hands every writer of the hook the same rows (so their device values
are read once), under :func:`.shutdown.exclusive`.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from typing import Any, Deque, List, Optional, Sequence, Tuple

from .. import _compat
from .._log import warn_once
from ..dashboards import metrics

Row = Tuple[str, Any]  # (tag, host float or device tensor: a loss of N elements is recorded as its mean)

#: the registry's tag names, bound once (rows are built for every step)
LOSS, LOSS_SCALE, LOG2_LOSS_SCALE = metrics.LOSS.name, metrics.LOSS_SCALE.name, metrics.LOG2_LOSS_SCALE.name
SKIPPED_STEPS, GRAD_NORM, LR = metrics.SKIPPED_STEPS.name, metrics.GRAD_NORM.name, metrics.LR.name

#: the largest step VisualDL's ``Value.id`` (an int64) holds
MAX_STEP = 2**63 - 1


def scale_rows(loss_scale: float) -> Tuple[Row, Row]:
    """``amp/loss_scale`` (raw, e.g. 65536) and ``amp/log2_loss_scale`` (16) for a host scale."""
    return (LOSS_SCALE, loss_scale), (LOG2_LOSS_SCALE, math.log2(loss_scale) if loss_scale > 0 else float("-inf"))


def checked_step(step: Any) -> int:
    """``step`` as VisualDL's step id (an int >= 0), or a TypeError/ValueError naming it.

    Raises:
        TypeError: ``step`` is not an int (a bool, a float, a tensor).
        ValueError: ``step`` is negative or beyond int64.
    """
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"StepEvent.step must be an int >= 0 (the 0-based iteration VisualDL plots on its x axis). "
                        f"Received: step={step!r} (of type {type(step).__name__})")
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"StepEvent.step must be an int from 0 to {MAX_STEP} (the 0-based iteration VisualDL plots "
                         f"on its x axis, an int64). Received: step={step!r}. Count iterations from 0.")
    return int(step)


class PendingSteps:
    """The steps a hook was told of and no writer has yet: appended by the training thread,
    turned into rows and handed to the writers by :meth:`pull` (a flush, in any thread).

    It holds no reference to its hook, so a hook garbage-collected with steps waiting still
    has them written (its writers, which hold this, are closed then).

    Args:
        outs: the hook's writers (each ``enqueue(entries)``), in ``report_to`` order.
    """

    def __init__(self, outs: Sequence[Any]) -> None:
        #: ``(StepEvent, walltime ms, extra host rows or None)``, oldest first (the training thread appends)
        self.events: Deque[Tuple[Any, int, Optional[List[Row]]]] = deque()
        self._outs = list(outs)
        self._skipped = 0  # skipped steps up to the last pulled one

    def __len__(self) -> int:
        return len(self.events)

    def pull(self) -> None:
        """Turn every waiting event into its rows and hand them to each writer, in order (inside
        :func:`.shutdown.exclusive` only). An event whose rows cannot be built (a StepEvent made
        by hand with a result that is no StepResult) is left out, warned once."""
        events = self.events
        count = len(events)  # a step the training thread adds meanwhile waits for the next pull
        if not count:
            return
        skipped, entries = self._skipped, []
        for i in range(count):
            event, walltime_ms, extra = events[i]
            try:
                skipped, rows = self._rows(event, extra, skipped)
            except (AttributeError, TypeError, ValueError) as exc:
                warn_once(f"visualdl:event:{id(self)}", "VisualDL hook: step %r cannot be recorded (%r): left out. "
                          "Hooks take the StepEvents a GradScaler or guard makes.", getattr(event, "step", None), exc)
                continue
            entries.append((event.step, walltime_ms, rows))
        for out in self._outs:
            out.enqueue(entries)
        self._skipped = skipped
        for _ in range(count):
            events.popleft()

    def forked(self) -> None:
        """In a forked child: the waiting steps are the parent's to write."""
        self.events.clear()

    def _rows(self, event: Any, extra: Optional[List[Row]], skipped: int) -> Tuple[int, List[Row]]:
        result = event.result
        skipped += bool(result.skipped)
        loss = event.loss
        rows: List[Row] = [] if loss is None else [(LOSS, self._loss(loss))]
        rows += scale_rows(result.loss_scale)
        rows.append((SKIPPED_STEPS, float(skipped)))
        norm = result.grad_norm
        if norm is not None:
            # a DistTensor norm is Replicate: its local value is the global norm (read with no collective)
            rows.append((GRAD_NORM, _compat.local_value(norm)))
        if event.lr is not None:
            rows.append((LR, event.lr))
        if extra:
            rows += extra
        return skipped, rows

    def _loss(self, loss: Any) -> Any:
        """The loss as logged: a loss of N elements is recorded as its mean (no kernel, no sync here:
        the writer averages the values it reads), named once."""
        shape = getattr(loss, "shape", None)
        if shape is None or math.prod(shape) == 1:
            return loss
        warn_once(f"visualdl:vector:{id(self)}", "VisualDLHook: the loss given to scale() has shape %s, not one "
                  "value: amp/loss records its mean (NaN for an empty loss). backward() of a non-scalar loss "
                  "computes the gradient of its sum; pass loss.mean() to scale() if the mean was meant.", list(shape))
        return loss if math.prod(shape) else math.nan
