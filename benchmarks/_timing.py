"""Timing helpers: interleaved repeats in one process, medians, and ratios printed once."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Tuple


def interleaved(variants: Dict[str, Callable[[], None]], steps: int, repeats: int, warmup: int = 20,
                samples: Dict[str, List[float]] | None = None) -> Dict[str, float]:
    """Median seconds per call of each variant; variants alternate so drift hits them alike.

    Pass ``samples={}`` to get the per-repeat times too (for :func:`paired_ratio`).
    """
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples = {} if samples is None else samples
    samples.update({name: [] for name in variants})
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            samples[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(values) for name, values in samples.items()}


def paired_ratio(samples: Dict[str, List[float]], numerator: str, denominator: str) -> float:
    """Median over repeats of numerator/denominator, each pair measured back to back.

    Robust to the machine's speed drifting during the run, which moves both sides of a pair.
    """
    return statistics.median(a / b for a, b in zip(samples[numerator], samples[denominator]))


def paired_quartiles(samples: Dict[str, List[float]], numerator: str, denominator: str) -> Tuple[float, float]:
    """The first and third quartiles of the pairs' ratios (the spread around :func:`paired_ratio`)."""
    low, _, high = statistics.quantiles([a / b for a, b in zip(samples[numerator], samples[denominator])], n=4)
    return low, high


def wall(cmd: List[str], repeats: int) -> float:
    """Median wall time of a command (seconds)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(title: str, ratio: float, goal: float, detail: str) -> bool:
    ok = ratio <= goal
    print(f"{title}: ratio {ratio:.3f} (goal <= {goal}) {'OK' if ok else 'MISSED'}  [{detail}]")
    sys.stdout.flush()
    return ok
