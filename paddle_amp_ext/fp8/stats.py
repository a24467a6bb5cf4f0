"""What FP8 loses, per layer, tensor and step: saturated and flushed fractions, amax, scales.

:class:`Fp8Stats` collects one :class:`QuantRecord` per quantization that
:func:`~paddle_amp_ext.fp8.linear.fp8_linears` makes (the input, weight and output gradient of
each FP8 linear, every step); :meth:`Fp8Stats.summary` reduces them per layer and tensor,
:meth:`Fp8Stats.worst` names the tensor that loses most and the fix, and :meth:`Fp8Stats.scalars`
gives dashboard tags (``fp8/<layer>/<tensor>/saturated`` ...).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .formats import flushed, fp8_format, saturated

ROLES = ("input", "weight", "output_grad")


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


def measure(scaled: np.ndarray, fmt: str, count: Optional[int] = None) -> Tuple[float, float]:
    """(saturated fraction, flushed fraction) of ``scaled`` (values already multiplied by their
    scales, before rounding to ``fmt``), out of ``count`` values (default: all; padding zeros
    are neither); (0, 0) for none."""
    count = scaled.size if count is None else count
    if count == 0:
        return 0.0, 0.0
    spec = fp8_format(fmt)
    return float(saturated(scaled, spec).sum()) / count, float(flushed(scaled, spec).sum()) / count


class Fp8Stats:
    """The records of an FP8 run; thread-safe appends. ``step`` counts optimizer steps as
    :meth:`next_step` is called (``fp8_linears`` does not know where a step ends)."""

    def __init__(self) -> None:
        self.records: List[QuantRecord] = []
        self.step = 0
        self._lock = threading.Lock()

    def add(self, layer: str, role: str, fmt: str, scaled: np.ndarray, amax: float, scales: np.ndarray,
            count: Optional[int] = None) -> None:
        """Record one quantization of ``count`` values (``scaled``: before rounding, maybe padded)."""
        count = scaled.size if count is None else count
        sat, flush = measure(scaled, fmt, count)
        self.add_counts(layer, role, fmt, round(sat * count), round(flush * count), count, amax, scales)

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
        self.step += 1

    def summary(self) -> List[dict]:
        """Per (layer, tensor): the worst saturated and flushed fractions over the steps, the
        largest amax and the scales' range; sorted by what is lost, worst first."""
        groups: Dict[Tuple[str, str], List[QuantRecord]] = {}
        for r in self.records:
            groups.setdefault((r.layer, r.role), []).append(r)
        rows = []
        for (layer, role), recs in groups.items():
            rows.append({
                "layer": layer, "tensor": role, "format": recs[-1].fmt, "steps": len({r.step for r in recs}),
                "saturated": max(r.saturated for r in recs), "flushed": max(r.flushed for r in recs),
                "amax": max(r.amax for r in recs),
                "scale_min": min(r.scale_min for r in recs), "scale_max": max(r.scale_max for r in recs),
            })
        return sorted(rows, key=lambda row: -(row["saturated"] + row["flushed"]))

    def scalars(self, step: Optional[int] = None) -> Dict[str, float]:
        """Dashboard tags for one step (default: the last recorded): ``fp8/<layer>/<tensor>/<what>``."""
        if not self.records:
            return {}
        step = self.records[-1].step if step is None else step
        out: Dict[str, float] = {}
        for r in self.records:
            if r.step == step:
                for key in ("saturated", "flushed", "amax", "scale_min", "scale_max"):
                    out[f"fp8/{r.layer}/{r.role}/{key}"] = getattr(r, key)
        return out

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
        return [asdict(r) for r in self.records]


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
