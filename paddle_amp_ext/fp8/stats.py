"""What FP8 loses, per layer, tensor and step: saturated and flushed fractions, amax, scales.

:class:`Fp8Stats` collects one :class:`QuantRecord` per quantization that
:func:`~paddle_amp_ext.fp8.linear.fp8_linears` makes (the input, weight and output gradient of
each FP8 linear, every step); :meth:`Fp8Stats.summary` reduces them per layer and tensor,
:meth:`Fp8Stats.worst` names the tensor that loses most and the fix, and :meth:`Fp8Stats.scalars`
gives a step's dashboard tags, named by the metric registry
(:func:`paddle_amp_ext.dashboards.metrics.fp8_tag`: ``fp8/<layer>/<tensor>/saturated`` ...).
A hook that watches the stats (``VisualDLHook.watch_fp8``) writes them at every scaler step,
taking each step's records with :meth:`Fp8Stats.end_step`. The records of the last ``keep_steps``
steps are kept; older ones live on in one running reduction per layer and tensor
(:mod:`.reduction`), so memory stays bounded however long the run.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import threading
import weakref
from dataclasses import asdict
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .._log import warn_once
from ..dashboards.metrics import FP8_QUANTITIES, FP8_TENSORS, fp8_tag
from .record import QuantRecord
from .reduction import QUANTITIES, Reduction, copied, fold

ROLES = FP8_TENSORS


#: The ended steps whose records an :class:`Fp8Stats` keeps by default (about 0.35 KB a record:
#: 672 records a step, those of a model with 224 linears, keep about 23 MB).
KEEP_STEPS = 100

_instances: weakref.WeakSet[Fp8Stats] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """A forked child gets a new lock per stats: a thread of the parent that held one at the fork
    does not exist in the child and would never release it."""
    for stats in list(_instances):
        stats._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


class Fp8Stats:
    """The records of an FP8 run; thread-safe appends. ``step`` counts optimizer steps as
    :meth:`next_step` (or :meth:`end_step`, which a hook watching the stats calls at every
    scaler step) is called: ``fp8_linears`` does not know where a step ends.

    Memory is bounded: :attr:`records` keeps the records of the step in progress and of the last
    ``keep_steps`` ended steps only (what :meth:`scalars`, :meth:`to_dicts` and
    :func:`~paddle_amp_ext.visualdl.write_fp8_stats` see). The records that leave it are folded
    into one running reduction per layer and tensor, so :meth:`summary`, :meth:`worst`,
    :attr:`recorded`, the doctor and the advisor answer for the whole run, and a hook watching the
    stats gets every record however many steps it falls behind (:meth:`end_step`).

    Args:
        keep_steps: the ended steps whose records are kept (default :data:`KEEP_STEPS`); 0 keeps
            the step in progress only.

    Raises:
        TypeError, ValueError: ``keep_steps`` is not an int >= 0.

    Example:
        >>> with amp.fp8_linears(model, "current", stats=Fp8Stats(keep_steps=10)) as stats:  # doctest: +SKIP
        ...     train(model)
        >>> stats.summary()[0]  # the whole run's worst tensor                                # doctest: +SKIP
    """

    def __init__(self, keep_steps: int = KEEP_STEPS) -> None:
        if isinstance(keep_steps, bool) or not isinstance(keep_steps, int):
            raise TypeError(f"keep_steps must be an int >= 0, the ended steps whose records are kept (default "
                            f"{KEEP_STEPS}). Received: keep_steps={keep_steps!r} (of type {type(keep_steps).__name__})")
        if keep_steps < 0:
            raise ValueError(f"keep_steps must be >= 0 (0 keeps the step in progress only; default {KEEP_STEPS}). "
                             f"Received: keep_steps={keep_steps}")
        self.keep_steps = keep_steps
        self.records: List[QuantRecord] = []  # the kept window; positions count from the run's first record
        self.step = 0
        self._dropped = 0  # records that left the window: records[i] is the run's record _dropped + i
        self._kept_from = 0  # the steps before this one lost records to the window
        self._gone: Dict[Tuple[str, str], Reduction] = {}  # the records that left, reduced
        self._cursor: Optional[int] = None  # the position a reader (end_step, step_start) takes from next
        self._unread: Dict[Tuple[str, str], Reduction] = {}  # the records that left from _cursor on, reduced
        self._lock = threading.Lock()
        _instances.add(self)

    def add_counts(self, layer: str, role: str, fmt: str, n_saturated: int, n_flushed: int, count: int,
                   amax: float, scales: np.ndarray, scale_range: Optional[Tuple[float, float]] = None) -> None:
        """Record one quantization of ``count`` values of which ``n_saturated`` saturated and
        ``n_flushed`` flushed (counted by the kernel that rounded them); ``scale_range``: the
        smallest and largest of ``scales`` where the kernel found them (two numpy reductions
        fewer), else computed here."""
        sat, flush = (n_saturated / count, n_flushed / count) if count else (0.0, 0.0)
        # the finite scales' range: one scale (per-tensor recipes) read as it is, else the plain
        # min and max when both are finite (then every scale is), else the finite ones'
        if scale_range is not None:
            low, high = float(scale_range[0]), float(scale_range[1])
        else:
            low, high = (float(scales.flat[0]),) * 2 if scales.size == 1 else (
                (float(scales.min()), float(scales.max())) if scales.size else (float("nan"),) * 2)
        if not (math.isfinite(low) and math.isfinite(high)):
            finite = scales[np.isfinite(scales)]
            low, high = (float(finite.min()), float(finite.max())) if finite.size else (float("nan"),) * 2
        with self._lock:
            self.records.append(QuantRecord(layer, role, self.step, fmt, sat, flush, float(amax), low, high))

    @property
    def recorded(self) -> int:
        """How many quantizations were recorded over the whole run (the kept window's and those before)."""
        with self._lock:
            return self._dropped + len(self.records)

    def next_step(self) -> None:
        """Mark the end of a training step: later records carry the next step number."""
        with self._lock:
            self.step += 1
            self._trim()

    def _trim(self) -> None:
        """Fold the records of the steps before the window into the reductions and drop them (lock held)."""
        first = self.step - self.keep_steps
        records = self.records
        n = 0
        while n < len(records) and records[n].step < first:
            n += 1
        if not n:
            return
        gone = records[:n]
        fold(self._gone, gone)
        if self._cursor is not None and self._cursor < self._dropped + n:
            fold(self._unread, gone[max(self._cursor - self._dropped, 0):])
        del records[:n]
        self._dropped += n
        self._kept_from = first

    def end_step(self, since: int = 0) -> Tuple[Dict[str, float], int]:
        """End the step (as :meth:`next_step`) and take the records made since position ``since``.

        This is how a hook writes each scaler step's records at its own step number: it keeps the
        position this returns and passes it back at the next step, so records are taken by
        position, once each, whatever their ``step`` field says. Positions count every record of
        the run (up to :attr:`recorded`), not the kept window: records that left the window since
        the position the last ``end_step`` (or :meth:`step_start`) returned are still taken,
        reduced, so a reader that falls behind by more than ``keep_steps`` (a program that calls
        :meth:`next_step` too) loses none. Another position before the window (two readers of one
        stats) takes the window's records only, warned once.

        Args:
            since: the position returned by the previous call (0 at first).

        Returns:
            (the dashboard tags of the records from ``since`` on, reduced as :meth:`scalars`
            reduces a step's records; the position to pass next time).

        Raises:
            TypeError, ValueError: ``since`` is not an int from 0 to :attr:`recorded`.
        """
        if isinstance(since, bool) or not isinstance(since, int):
            raise TypeError(f"since must be the int end_step returned last (0 at first). Received: since={since!r} "
                            f"(of type {type(since).__name__})")
        unread: Dict[Tuple[str, str], Reduction] = {}
        lost = 0
        with self._lock:
            end = self._dropped + len(self.records)
            if not 0 <= since <= end:
                raise ValueError(f"since must be from 0 to the records made, {end}: the position end_step returned "
                                 f"last. Received: since={since}")
            if since == self._cursor:
                unread, self._unread = self._unread, {}
            elif since < self._dropped:
                lost = self._dropped
            taken = self.records[max(since - self._dropped, 0):]
            self._cursor = end
            self.step += 1
            self._trim()
        if lost:
            warn_once(f"fp8:lost:{id(self)}", "Fp8Stats.end_step(%d): the records before position %d left the window "
                      "(keep_steps=%d) and are not in these tags; have one reader per Fp8Stats, or keep more steps.",
                      since, lost, self.keep_steps)
        return _scalars(taken, unread), end

    def step_start(self) -> int:
        """The position of the first record of the step in progress (:attr:`recorded` when it has
        none yet): where a hook that starts watching begins, so the step it ends first is whole
        and ended steps are not written again. :meth:`end_step` from there loses no record."""
        with self._lock:
            start = len(self.records)
            while start and self.records[start - 1].step >= self.step:
                start -= 1
            self._cursor, self._unread = self._dropped + start, {}
            return self._cursor

    def summary(self) -> List[dict]:
        """Per (layer, tensor), over the whole run: the worst saturated and flushed fractions over
        the steps, the largest amax and the scales' range (NaN ignored, as in :meth:`scalars`),
        the number of steps with a record and the last format; sorted by what is lost, worst first."""
        with self._lock:
            reductions = copied(self._gone)
            records = list(self.records)
        rows = []
        for (layer, role), r in fold(reductions, records).items():
            row = {"layer": layer, "tensor": role, "format": r.fmt, "steps": r.steps}
            row.update(zip(QUANTITIES, r.values()))
            rows.append(row)
        return sorted(rows, key=lambda row: -(row["saturated"] + row["flushed"]))

    def scalars(self, step: Optional[int] = None) -> Dict[str, float]:
        """Dashboard tags for one step of the kept window (default: the last recorded):
        ``fp8/<layer>/<tensor>/<quantity>``.

        The names come from the metric registry (:func:`paddle_amp_ext.dashboards.metrics.fp8_tag`).
        A tensor quantized several times in the step (a model called twice, gradient
        accumulation) gets the worst of them: the largest saturated and flushed fractions and
        amax, the smallest ``scale_min`` and the largest ``scale_max`` (NaN ignored unless all
        are NaN). A layer whose name cannot be a tag (a control character, over 512
        characters) is left out, warned once. A step without records gives ``{}``.

        Raises:
            TypeError: ``step`` is not an int or None.
            ValueError: ``step`` is older than the kept window and had records.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral)):
            raise TypeError(f"step must be an int (a step of the kept window) or None for the last recorded. "
                            f"Received: step={step!r} (of type {type(step).__name__})")
        with self._lock:
            records = list(self.records)
            kept_from = self._kept_from
        if step is not None and step < kept_from:
            raise ValueError(f"step {step} left the kept window (the steps from {kept_from} on, keep_steps="
                             f"{self.keep_steps}): its records are in summary() only. Fp8Stats(keep_steps=...) keeps "
                             "more; a hook watching the stats (watch_fp8) writes every step as it ends.")
        if not records:
            return {}
        step = records[-1].step if step is None else step
        return _scalars([r for r in records if r.step == step])

    def log_to(self, writer: object, step: Optional[int] = None) -> int:
        """Write :meth:`scalars` of ``step`` to a dashboard writer with ``add_scalar(tag, value,
        step)`` (VisualDL's ``LogWriter``); returns how many were written.

        Raises:
            TypeError: ``writer`` has no ``add_scalar``; ``step`` as :meth:`scalars`.
            ValueError: as :meth:`scalars`.
        """
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(f"writer must have add_scalar(tag, value, step), as VisualDL's LogWriter. "
                            f"Received: {type(writer).__name__}")
        if step is None:
            with self._lock:
                if not self.records:
                    return 0
                step = self.records[-1].step
        values = self.scalars(step)
        for tag, value in values.items():
            writer.add_scalar(tag=tag, value=value, step=step)
        return len(values)

    def worst(self, threshold: float = 1e-3) -> Optional[dict]:
        """The (layer, tensor) that loses most over the whole run, with the fix, or None when no
        tensor loses more than ``threshold`` of its values."""
        rows = self.summary()
        if not rows or rows[0]["saturated"] + rows[0]["flushed"] <= threshold:
            return None
        row = dict(rows[0])
        row["fix"] = fix_for(row)
        return row

    def to_dicts(self) -> List[dict]:
        """The kept window's records (the step in progress and the last ``keep_steps`` ended
        steps; :meth:`summary` has the whole run) as dicts of :class:`QuantRecord`'s fields."""
        with self._lock:
            records = list(self.records)
        return [asdict(r) for r in records]


def _by_tensor(records: Iterable[QuantRecord]) -> Dict[Tuple[str, str], List[QuantRecord]]:
    groups: Dict[Tuple[str, str], List[QuantRecord]] = {}
    for r in records:
        groups.setdefault((r.layer, r.role), []).append(r)
    return groups


@functools.lru_cache(maxsize=4096)
def _tags(layer: str, role: str) -> Tuple[str, ...]:
    """The registry's tags of one layer and tensor, one per quantity (checked once)."""
    return tuple(fp8_tag(layer, role, quantity) for quantity in FP8_QUANTITIES)


def _scalars(records: List[QuantRecord], before: Optional[Dict[Tuple[str, str], Reduction]] = None
             ) -> Dict[str, float]:
    """The dashboard tags of ``records`` (one step's), each tensor reduced by :class:`Reduction`
    after its reduction in ``before`` (the records taken with them that left the window; consumed)."""
    before = {} if before is None else before
    out: Dict[str, float] = {}
    rows = []
    for key, recs in _by_tensor(records).items():
        reduction = before.pop(key, None)
        if reduction is None and len(recs) == 1:  # the usual case: one quantization of the tensor in the step
            r = recs[0]
            rows.append((key, (r.saturated, r.flushed, r.amax, r.scale_min, r.scale_max)))
        else:
            rows.append((key, fold({key: reduction or Reduction()}, recs)[key].values()))
    rows += [(key, reduction.values()) for key, reduction in before.items()]
    for (layer, role), values in rows:
        try:
            tags = _tags(layer, role)
        except (TypeError, ValueError) as exc:
            warn_once(f"fp8:tag:{layer!r}:{role!r}", "FP8 stats: layer %r has no dashboard tags: %s", layer, exc)
            continue
        out.update(zip(tags, values))
    return out


def fix_for(row: dict) -> str:
    """The remedy for a summary row: what the loss means and what to change."""
    where = f"layer {row['layer']!r} {row['tensor'].replace('_', ' ')}"
    if row["saturated"] >= row["flushed"]:
        return (f"{where}: {row['saturated']:.2%} of values saturate at +-max ({row['format']}); keep the layer in "
                "bf16 (fp8_exclude_layers), use current or blockwise scaling instead of delayed, or a smaller "
                "block so one outlier does not set the scale of its neighbours")
    return (f"{where}: {row['flushed']:.2%} of nonzero values flush to zero ({row['format']}); keep the layer in "
            "bf16 (fp8_exclude_layers), or use a smaller block (1x128) so small values get their own scale"
            + (", or e5m2 for gradients (recipe='current' uses the hybrid format)" if row["tensor"] == "output_grad"
               else "") + "; an epsilon only bounds the scale and does not help here")
