"""The throughput verdict: does AMP pay on this model and GPU, and if not, why (no Paddle here).

The device side (:mod:`.gpu_checks`) measures; this module only reads the numbers: steps/s of
interleaved repeats per configuration, peak memory, the share of the step the host spends issuing
ops, and the model's matmul/conv dimensions and batch size.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

#: A configuration pays when its median steps/s is at least this times fp32's.
MIN_SPEEDUP = 1.1
#: Fewer rows than this per step leave Tensor Cores mostly idle.
TINY_BATCH = 8
#: The loop is bound by the host when issuing the ops takes at least this share of the step.
HOST_BOUND = 0.9


@dataclass(frozen=True)
class Measurement:
    """One configuration's numbers.

    Attributes:
        config: ``"fp32"``, ``"O1-float16"``, ``"O2-bfloat16"``, ...
        steps_per_s: one value per repeat (repeats of the configurations interleaved).
        peak_memory_bytes: the largest memory allocated during its steps, None if not measured.
        host_fraction: time to issue a step's ops / time for the device to finish them, None if not
            measured.
    """

    config: str
    steps_per_s: Tuple[float, ...]
    peak_memory_bytes: Optional[int] = None
    host_fraction: Optional[float] = None

    def __post_init__(self) -> None:
        if not self.steps_per_s:
            raise ValueError(f"{self.config}: steps_per_s is empty; at least one repeat is needed")
        bad = [v for v in self.steps_per_s if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"{self.config}: steps_per_s must be finite numbers > 0, received {bad}")


@dataclass(frozen=True)
class ModelFacts:
    """What about a model decides whether low precision can be fast.

    Attributes:
        batch: rows in the first input's first dimension.
        odd_dims: ``"name [shape]"`` for each matmul/conv weight with a dimension not a multiple of 8.
    """

    batch: int
    odd_dims: Tuple[str, ...] = ()


def odd_dimensions(weights: Mapping[str, Sequence[int]], multiple: int = 8) -> Tuple[str, ...]:
    """``"name [shape]"`` for each weight with a dimension not a multiple of ``multiple``.

    Only a weight's first two dimensions count (a Linear's in/out, a conv's out/in channels), not
    a conv's kernel size.
    """
    odd = []
    for name, shape in weights.items():
        dims = [int(d) for d in tuple(shape)[:2]]
        if any(d % multiple for d in dims):
            odd.append(f"{name} {list(shape)}")
    return tuple(odd)


def median_spread(values: Sequence[float]) -> Tuple[float, float]:
    """The median and the spread ``(max - min) / median`` of the repeats."""
    middle = statistics.median(values)
    return middle, (max(values) - min(values)) / middle


@dataclass(frozen=True)
class Row:
    config: str
    median: float
    spread: float
    speedup: float
    peak_memory_bytes: Optional[int]
    memory_ratio: Optional[float]

    def to_dict(self) -> dict:
        return {"config": self.config, "steps_per_s": self.median, "spread": self.spread, "speedup": self.speedup,
                "peak_memory_bytes": self.peak_memory_bytes, "memory_vs_fp32": self.memory_ratio}


@dataclass(frozen=True)
class Verdict:
    """Whether AMP pays on one model, with the reasons when it does not.

    Attributes:
        model: the model's name.
        rows: fp32 first, then each AMP configuration.
        best: the fastest configuration (``"fp32"`` when none beats it by :data:`MIN_SPEEDUP`).
        pays: whether an AMP configuration is at least :data:`MIN_SPEEDUP` times fp32's median.
        reasons: why AMP does not pay (or why the numbers cannot say), empty when it pays.
    """

    model: str
    rows: Tuple[Row, ...]
    best: str
    pays: bool
    reasons: Tuple[str, ...]

    def to_dict(self) -> dict:
        return {"model": self.model, "best": self.best, "pays": self.pays, "reasons": list(self.reasons),
                "rows": [r.to_dict() for r in self.rows]}


def judge(model: str, measurements: Sequence[Measurement], facts: ModelFacts) -> Verdict:
    """The verdict for one model from its measurements (``"fp32"`` among them).

    Raises:
        ValueError: no ``"fp32"`` measurement, or a configuration measured twice.
    """
    by_config: Dict[str, Measurement] = {}
    for m in measurements:
        if m.config in by_config:
            raise ValueError(f"configuration {m.config!r} measured twice; expected one Measurement each")
        by_config[m.config] = m
    if "fp32" not in by_config:
        raise ValueError(f"no 'fp32' measurement among {sorted(by_config)}: the verdict compares with fp32")
    base = by_config["fp32"]
    base_median, base_spread = median_spread(base.steps_per_s)
    rows = []
    for m in [base] + [m for m in measurements if m.config != "fp32"]:
        median, spread = median_spread(m.steps_per_s)
        ratio = None
        if m.peak_memory_bytes is not None and base.peak_memory_bytes:
            ratio = m.peak_memory_bytes / base.peak_memory_bytes
        rows.append(Row(m.config, median, spread, median / base_median, m.peak_memory_bytes, ratio))
    amp_rows = rows[1:]
    fastest = max(amp_rows, key=lambda r: r.speedup, default=None)
    pays = fastest is not None and fastest.speedup >= MIN_SPEEDUP
    best = fastest.config if pays else "fp32"
    reasons: Tuple[str, ...] = ()
    if fastest is None:
        reasons = ("no AMP configuration could run on this GPU",)
    elif not pays:
        reasons = _why_not(fastest, rows[0], base, facts)
    return Verdict(model=model, rows=tuple(rows), best=best, pays=pays, reasons=reasons)


def _why_not(fastest: Row, base_row: Row, base: Measurement, facts: ModelFacts) -> Tuple[str, ...]:
    reasons = []
    if facts.odd_dims:
        shown = ", ".join(facts.odd_dims[:4]) + (", ..." if len(facts.odd_dims) > 4 else "")
        reasons.append(f"dimensions not multiples of 8 ({shown}): float16/bfloat16 matmuls and convs "
                       "use Tensor Cores only when they are; pad them to a multiple of 8")
    if facts.batch < TINY_BATCH:
        reasons.append(f"a batch of {facts.batch}: too little work per kernel for low precision to show; "
                       f"try a batch of {TINY_BATCH} or more")
    if base.host_fraction is not None and base.host_fraction >= HOST_BOUND:
        reasons.append(f"the loop is bound by the host: issuing a step's ops takes "
                       f"{base.host_fraction:.0%} of the time the GPU needs to run them, so faster "
                       "kernels leave it waiting; fewer, larger ops (a bigger batch, fused layers) help")
    gain = fastest.speedup - 1.0
    noise = max(base_row.spread, fastest.spread)
    if noise >= abs(gain):
        reasons.append(f"inconclusive: the repeats spread by {noise:.0%}, more than the "
                       f"{gain:+.0%} difference between {fastest.config} and fp32")
    if not reasons:
        reasons.append(f"none of the known causes (dimensions, batch, host) applies: {fastest.config} "
                       f"ran at {fastest.speedup:.2f}x fp32")
    return tuple(reasons)
