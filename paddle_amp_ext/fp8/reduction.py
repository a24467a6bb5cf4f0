"""One tensor's FP8 records reduced to the worst of them, one record at a time.

:class:`Reduction` is what :class:`~paddle_amp_ext.fp8.stats.Fp8Stats` keeps per (layer, tensor)
for the whole run once a record leaves its window, and what a step's dashboard tags reduce a
tensor quantized several times to: the largest saturated and flushed fractions and amax, the
smallest ``scale_min`` and the largest ``scale_max``, NaN ignored unless all are NaN, the number
of distinct steps and the last format. Folding records in order gives exactly what reducing the
whole list at once gives (the first of equal values is kept, as Python's ``max`` keeps it).
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Tuple

from .record import QuantRecord

#: The reduced quantities, in the order of the metric registry's FP8 quantities.
QUANTITIES = ("saturated", "flushed", "amax", "scale_min", "scale_max")


def _larger(kept: float, value: float) -> float:
    """The larger of the two, NaN ignored (``kept`` first: an equal ``value`` does not replace it)."""
    return value if value > kept or (kept != kept and value == value) else kept


def _smaller(kept: float, value: float) -> float:
    return value if value < kept or (kept != kept and value == value) else kept


class Reduction:
    """The worst of one tensor's records so far; :meth:`add` folds the next one."""

    __slots__ = ("saturated", "flushed", "amax", "scale_min", "scale_max", "steps", "last_step", "fmt")

    def __init__(self) -> None:
        self.saturated = self.flushed = self.amax = self.scale_min = self.scale_max = math.nan
        self.steps = 0
        self.last_step = -1
        self.fmt = ""

    def add(self, r: QuantRecord) -> None:
        """Fold one record in (records come in step order, so a new step is a step not seen)."""
        self.saturated = _larger(self.saturated, r.saturated)
        self.flushed = _larger(self.flushed, r.flushed)
        self.amax = _larger(self.amax, r.amax)
        self.scale_min = _smaller(self.scale_min, r.scale_min)
        self.scale_max = _larger(self.scale_max, r.scale_max)
        if r.step != self.last_step:
            self.steps += 1
            self.last_step = r.step
        self.fmt = r.fmt

    def copy(self) -> Reduction:
        out = Reduction()
        for name in self.__slots__:
            setattr(out, name, getattr(self, name))
        return out

    def values(self) -> Tuple[float, ...]:
        """The reduced quantities in :data:`QUANTITIES` order."""
        return self.saturated, self.flushed, self.amax, self.scale_min, self.scale_max


def fold(into: Dict[Tuple[str, str], Reduction], records: Iterable[QuantRecord]) -> Dict[Tuple[str, str], Reduction]:
    """Fold ``records`` (in order) into the per-(layer, tensor) reductions ``into``; returns ``into``."""
    for r in records:
        key = (r.layer, r.role)
        reduction = into.get(key)
        if reduction is None:
            reduction = into[key] = Reduction()
        reduction.add(r)
    return into


def copied(reductions: Dict[Tuple[str, str], Reduction]) -> Dict[Tuple[str, str], Reduction]:
    """A copy of the reductions that folding more records into leaves ``reductions`` as they were."""
    return {key: reduction.copy() for key, reduction in reductions.items()}
