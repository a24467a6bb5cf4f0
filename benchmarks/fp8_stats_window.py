"""What ``Fp8Stats``' bounded window costs a step: ``end_step`` with records leaving the window / without.

A model with 224 FP8 linears makes 672 records a step (input, weight and output gradient of each).
Each step here adds them with ``add_counts`` (not timed: the same in every variant) and times the
hook's ``end_step``, which with a bounded window also folds the step that leaves it into the
whole-run reduction. Variants: ``keep_steps`` 100 (the default) and 0, against a window too long to
drop anything in the run (what ``Fp8Stats`` did before it was bounded; its memory grows). The
variants alternate in blocks of steps, who goes first alternating; the ratio is the median of the
paired per-block ratios with the 25th-75th percentile spread. The clock is the process's CPU time
(``time.process_time``), so a loaded machine's waits for a core are not counted. Then ``summary()``
after the run, and the records each holds.

    python benchmarks/fp8_stats_window.py [--steps 50] [--repeats 11]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List

import numpy as np
from matrix import machine

from paddle_amp_ext.fp8.stats import Fp8Stats

LINEARS = 224
ROLES = ("input", "weight", "output_grad")
UNBOUNDED = 10**9


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps per block")
    parser.add_argument("--repeats", type=int, default=11, help="blocks per variant")
    args = parser.parse_args(argv)
    scales = np.array([1.0, 2.0], np.float32)
    names = [f"layers.{i}.mlp" for i in range(LINEARS)]
    variants: Dict[str, Fp8Stats] = {"keep 100": Fp8Stats(), "keep 0": Fp8Stats(keep_steps=0),
                                     "unbounded": Fp8Stats(keep_steps=UNBOUNDED)}
    since = {name: 0 for name in variants}
    samples: Dict[str, List[float]] = {name: [] for name in variants}

    def block(name: str, steps: int) -> float:
        stats, spent = variants[name], 0.0
        for step in range(steps):
            for i, layer in enumerate(names):
                for role in ROLES:
                    stats.add_counts(layer, role, "e4m3fn", i % 7, step % 5, 4096, 1.0 + i, scales)
            start = time.process_time()
            since[name] = stats.end_step(since[name])[1]
            spent += time.process_time() - start
        return spent / steps

    for name in variants:  # warm up: the bounded windows fill, so every timed step drops one
        block(name, 101)
    order = list(variants)
    for r in range(args.repeats):
        for name in order if r % 2 == 0 else reversed(order):
            samples[name].append(block(name, args.steps))
    print(machine())
    base = samples["unbounded"]
    for name in ("keep 100", "keep 0"):
        ratios = sorted(a / b for a, b in zip(samples[name], base))
        q = statistics.quantiles(ratios, n=4)
        print(f"end_step, {name:9s}: {statistics.median(samples[name]) * 1e3:.3f} ms vs unbounded "
              f"{statistics.median(base) * 1e3:.3f} ms: ratio {statistics.median(ratios):.2f} [{q[0]:.2f}, {q[2]:.2f}]")
    for name, stats in variants.items():
        start = time.process_time()
        stats.summary()
        print(f"summary(), {name:9s}: {(time.process_time() - start) * 1e3:.1f} ms after {stats.step} steps; "
              f"{len(stats.records)} records held of {stats.recorded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
