"""What FP8 loses, per layer, tensor and step: saturated and flushed fractions, amax, scales.

:class:`Fp8Stats` collects one :class:`QuantRecord` per quantization that
:func:`~paddle_amp_ext.fp8.linear.fp8_linears` makes (the input, weight and output gradient of
each FP8 linear, every step); :meth:`Fp8Stats.summary` reduces them per layer and tensor,
:meth:`Fp8Stats.worst` names the tensor that loses most and the fix, and :meth:`Fp8Stats.scalars`
gives a step's dashboard tags, named by the metric registry
(:func:`paddle_amp_ext.dashboards.metrics.fp8_tag`: ``fp8/<layer>/<tensor>/saturated`` ...).
A hook that watches the stats (``VisualDLHook.watch_fp8``) writes them at every scaler step,
taking each step's records with :meth:`Fp8Stats.end_step`.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .._log import warn_once
from ..dashboards.metrics import FP8_QUANTITIES, FP8_TENSORS, fp8_tag

ROLES = FP8_TENSORS


@dataclass(frozen=True)
class QuantRecord:
    """One quantization of one tensor.

    Attributes:
        layer: the layer's name in the model.
        role: ``"input"``, ``"weight"`` or ``"output_grad"``.
        step: the training step it belongs to.
        fmt: the FP8 format (``"e4m3fn"`` or ``"e5m2"``).
        saturated: the fraction of values clipped to +-max.
        flushed: the fraction of nonzero values rounded to zero.
        amax: the tensor's largest absolute value.
        scale_min: the smallest of its scales.
        scale_max: the largest of its scales.
    """

    layer: str
    role: str
    step: int
    fmt: str
    saturated: float
    flushed: float
    amax: float
    scale_min: float
    scale_max: float


class Fp8Stats:
    """The records of an FP8 run; thread-safe appends. ``step`` counts optimizer steps as
    :meth:`next_step` (or :meth:`end_step`, which a hook watching the stats calls at every
    scaler step) is called: ``fp8_linears`` does not know where a step ends."""

    def __init__(self) -> None:
        self.records: List[QuantRecord] = []
        self.step = 0
        self._lock = threading.Lock()

    def add_counts(self, layer: str, role: str, fmt: str, n_saturated: int, n_flushed: int, count: int,
                   amax: float, scales: np.ndarray) -> None:
        """Record one quantization of ``count`` values of which ``n_saturated`` saturated and
        ``n_flushed`` flushed (counted by the kernel that rounded them)."""
        sat, flush = (n_saturated / count, n_flushed / count) if count else (0.0, 0.0)
        finite = scales[np.isfinite(scales)] if scales.size else scales
        low = float(finite.min()) if finite.size else float("nan")
        high = float(finite.max()) if finite.size else float("nan")
        with self._lock:
            self.records.append(QuantRecord(layer, role, self.step, fmt, sat, flush, float(amax), low, high))

    def next_step(self) -> None:
        """Mark the end of a training step: later records carry the next step number."""
        with self._lock:
            self.step += 1

    def end_step(self, since: int = 0) -> Tuple[Dict[str, float], int]:
        """End the step (as :meth:`next_step`) and take the records made since position ``since``.

        This is how a hook writes each scaler step's records at its own step number: it keeps the
        position this returns and passes it back at the next step, so records are taken by
        position, once each, whatever their ``step`` field says.

        Args:
            since: the position returned by the previous call (0 at first).

        Returns:
            (the dashboard tags of ``records[since:]``, reduced as :meth:`scalars` reduces a
            step's records; the position to pass next time).

        Raises:
            TypeError, ValueError: ``since`` is not an int from 0 to ``len(records)``.
        """
        if isinstance(since, bool) or not isinstance(since, int):
            raise TypeError(f"since must be the int end_step returned last (0 at first). Received: since={since!r} "
                            f"(of type {type(since).__name__})")
        with self._lock:
            end = len(self.records)
            if not 0 <= since <= end:
                raise ValueError(f"since must be from 0 to len(records) = {end}, the position end_step returned "
                                 f"last. Received: since={since}")
            taken = self.records[since:end]
            self.step += 1
        return _scalars(taken), end

    def step_start(self) -> int:
        """The position in :attr:`records` of the first record of the step in progress
        (``len(records)`` when it has none yet): where a hook that starts watching begins, so
        the step it ends first is whole and ended steps are not written again."""
        with self._lock:
            start = len(self.records)
            while start and self.records[start - 1].step >= self.step:
                start -= 1
            return start

    def _snapshot(self) -> List[QuantRecord]:
        with self._lock:
            return list(self.records)

    def summary(self) -> List[dict]:
        """Per (layer, tensor): the worst saturated and flushed fractions over the steps, the
        largest amax and the scales' range (NaN ignored, as in :meth:`scalars`); sorted by what
        is lost, worst first."""
        rows = []
        for (layer, role), recs in _by_tensor(self._snapshot()).items():
            row = {"layer": layer, "tensor": role, "format": recs[-1].fmt, "steps": len({r.step for r in recs})}
            row.update(_reduced(recs))
            rows.append(row)
        return sorted(rows, key=lambda row: -(row["saturated"] + row["flushed"]))

    def scalars(self, step: Optional[int] = None) -> Dict[str, float]:
        """Dashboard tags for one step (default: the last recorded): ``fp8/<layer>/<tensor>/<quantity>``.

        The names come from the metric registry (:func:`paddle_amp_ext.dashboards.metrics.fp8_tag`).
        A tensor quantized several times in the step (a model called twice, gradient
        accumulation) gets the worst of them: the largest saturated and flushed fractions and
        amax, the smallest ``scale_min`` and the largest ``scale_max`` (NaN ignored unless all
        are NaN). A layer whose name cannot be a tag (a control character, over 512
        characters) is left out, warned once.
        """
        records = self._snapshot()
        if not records:
            return {}
        step = records[-1].step if step is None else step
        return _scalars([r for r in records if r.step == step])

    def log_to(self, writer: object, step: Optional[int] = None) -> int:
        """Write :meth:`scalars` of ``step`` to a dashboard writer with ``add_scalar(tag, value,
        step)`` (VisualDL's ``LogWriter``); returns how many were written.

        Raises:
            TypeError: ``writer`` has no ``add_scalar``.
        """
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(f"writer must have add_scalar(tag, value, step), as VisualDL's LogWriter. "
                            f"Received: {type(writer).__name__}")
        if not self.records:
            return 0
        step = self.records[-1].step if step is None else step
        values = self.scalars(step)
        for tag, value in values.items():
            writer.add_scalar(tag=tag, value=value, step=step)
        return len(values)

    def worst(self, threshold: float = 1e-3) -> Optional[dict]:
        """The (layer, tensor) that loses most, with the fix, or None when no tensor loses more
        than ``threshold`` of its values."""
        rows = self.summary()
        if not rows or rows[0]["saturated"] + rows[0]["flushed"] <= threshold:
            return None
        row = dict(rows[0])
        row["fix"] = fix_for(row)
        return row

    def to_dicts(self) -> List[dict]:
        """Every record as a dict (:class:`QuantRecord`'s fields)."""
        return [asdict(r) for r in self._snapshot()]


def _by_tensor(records: Iterable[QuantRecord]) -> Dict[Tuple[str, str], List[QuantRecord]]:
    groups: Dict[Tuple[str, str], List[QuantRecord]] = {}
    for r in records:
        groups.setdefault((r.layer, r.role), []).append(r)
    return groups


def _top(values: Iterable[float], pick=max) -> float:
    """``pick`` of the values that are not NaN; NaN when all are (Python's max is order-dependent with NaN)."""
    kept = [v for v in values if not math.isnan(v)]
    return pick(kept) if kept else math.nan


def _reduced(recs: List[QuantRecord]) -> Dict[str, float]:
    """One tensor's records as one value per quantity: the worst of them."""
    return {"saturated": _top(r.saturated for r in recs), "flushed": _top(r.flushed for r in recs),
            "amax": _top(r.amax for r in recs), "scale_min": _top((r.scale_min for r in recs), min),
            "scale_max": _top(r.scale_max for r in recs)}


@functools.lru_cache(maxsize=4096)
def _tags(layer: str, role: str) -> Tuple[str, ...]:
    """The registry's tags of one layer and tensor, one per quantity (checked once)."""
    return tuple(fp8_tag(layer, role, quantity) for quantity in FP8_QUANTITIES)


def _scalars(records: List[QuantRecord]) -> Dict[str, float]:
    """The dashboard tags of ``records`` (one step's), each tensor reduced by :func:`_reduced`."""
    out: Dict[str, float] = {}
    for (layer, role), recs in _by_tensor(records).items():
        try:
            tags = _tags(layer, role)
        except (TypeError, ValueError) as exc:
            warn_once(f"fp8:tag:{layer!r}:{role!r}", "FP8 stats: layer %r has no dashboard tags: %s", layer, exc)
            continue
        if len(recs) == 1:  # the usual case: one quantization of the tensor in the step
            r = recs[0]
            out.update(zip(tags, (r.saturated, r.flushed, r.amax, r.scale_min, r.scale_max)))
        else:
            values = _reduced(recs)
            out.update(zip(tags, (values[quantity] for quantity in FP8_QUANTITIES)))
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
