"""Known answers a freshly loaded rounding kernel must reproduce before the rehearsal uses it."""

from __future__ import annotations

import ctypes
from typing import Callable, List, Tuple

Probe = Tuple[List[float], List[float]]


def fp16_probe() -> Probe:
    """Values at every kind of rounding decision, and what numpy's float16 conversion makes of them."""
    import numpy as np

    values = np.array([0.1, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2049.0, 2051.0, 65504.0, 65519.0, 65520.0,
                       -7.0e4, 3.0e38, float("inf"), 2.0**-14, 2.0**-25, 3 * 2.0**-26, 2.0**-26, 1e-8,
                       1e-40, -1e-6, 0.0, 8.0, 12345.678], dtype=np.float32)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    return values.tolist(), expected.tolist()


def bf16_probe() -> Probe:
    """Values at every kind of bfloat16 rounding decision (8 significant bits), and their
    nearest-even bfloat16 values, written out (no numpy conversion to compare with)."""
    ulp, top = 2.0**-7, (2.0 - 2.0**-7) * 2.0**127  # the ulp at 1; the largest finite value
    inputs = [1.0 + ulp / 2, 1.0 + 3 * ulp / 2, 1.0 + ulp / 2 + 2.0**-20, 0.1, -3.0, top * (1 + 2.0**-9),
              (2.0 - 2.0**-8) * 2.0**127, 3.0e38, -float("inf"), 2.0**-133, 2.0**-134, 3 * 2.0**-134,
              2.0**-149, -0.0, 2.0**-126 - 2.0**-149]
    expected = [1.0, 1.0 + 2 * ulp, 1.0 + ulp, 0.10009765625, -3.0, top, float("inf"), 226 * 2.0**120,
                -float("inf"), 2.0**-133, 0.0, 2.0**-132, 0.0, -0.0, 2.0**-126]
    return inputs, expected


#: How long the repeated probe is: four 16-value vectors and a tail, so that every value of a
#: probe meets the vector loops in several lanes and the scalar tail too.
TILED = 4 * 16 + 5


def wrong_answer(rounder: Callable[[int, int, int], int], probe: Probe) -> str:
    """'' when ``rounder`` rounds the probe's values to its expected ones, alone and repeated to
    :data:`TILED` values, else what it gave."""
    values, expected = probe
    repeat = -(-TILED // len(values))
    for given, wanted in ((values, expected), ((values * repeat)[:TILED], (expected * repeat)[:TILED])):
        buffer = (ctypes.c_float * len(given))(*given)
        rounder(ctypes.addressof(buffer), ctypes.addressof(buffer), len(given))
        if list(buffer) != wanted:
            return f"{list(buffer)} != {wanted}"
    return ""


def wrong_finite_answer(scan: Callable[[int, int], int]) -> str:
    """'' when ``scan`` finds every inf and nan (at each position of a vectorised block and its
    tail, and in the longest runs that stay finite) and passes finite values, else what it got wrong."""
    inf, nan = float("inf"), float("nan")
    wrong = []
    for n in (0, 1, 7, 8, 31, 32, 33, 100):
        values = [65504.0 * (-1) ** i for i in range(n)] + [3.4e38, -3.4e38, 1e-45][: max(0, min(3, n))]
        buffer = (ctypes.c_float * len(values))(*values)
        if scan(ctypes.addressof(buffer), len(values)) != 1:
            wrong.append(f"finite n={len(values)}")
        for position in range(len(values)):
            for bad in (inf, -inf, nan):
                copy = (ctypes.c_float * len(values))(*values)
                copy[position] = bad
                if scan(ctypes.addressof(copy), len(values)) != 0:
                    wrong.append(f"{bad} at {position} of {len(values)}")
    return "; ".join(wrong[:5])
