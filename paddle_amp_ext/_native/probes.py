"""Known answers a freshly loaded rounding kernel must reproduce before the rehearsal uses it."""

from __future__ import annotations

import ctypes
import math
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


def fp8_probe(fmt: int) -> Tuple[List[float], List[float], Tuple[int, int]]:
    """Values at every kind of FP8 rounding decision for format code ``fmt`` (0: e4m3fn, 1: e5m2),
    their SATFINITE values written out (ties to even, subnormals, saturation of overflow and inf,
    the sign of a flushed zero), and how many of them saturate and flush."""
    nan = float("nan")
    if fmt == 0:
        inputs = [0.1, 1.0625, 1.1875, 479.0, 480.0, 1e30, float("inf"), -float("inf"), 2.0**-10, 3 * 2.0**-10,
                  -2.0**-10, 2.0**-6 - 2.0**-10, -300.5, 1e-40, 0.0, nan]
        expected = [0.1015625, 1.0, 1.25, 448.0, 448.0, 448.0, 448.0, -448.0, 0.0, 2.0**-8, -0.0, 2.0**-6, -288.0,
                    0.0, 0.0, nan]
        return inputs, expected, (5, 3)  # beyond 464: 479, 480, 1e30, +-inf; at most 2**-10: +-2**-10, 1e-40
    inputs = [0.1, 1.125, 1.375, 61439.0, 61440.0, 1e30, float("inf"), -float("inf"), 2.0**-17, 3 * 2.0**-17,
              -2.0**-17, 2.0**-14 - 2.0**-17, -300.5, 1e-40, 0.0, nan]
    expected = [0.09375, 1.0, 1.5, 57344.0, 57344.0, 57344.0, 57344.0, -57344.0, 0.0, 2.0**-15, -0.0, 2.0**-14,
                -320.0, 0.0, 0.0, nan]
    return inputs, expected, (3, 3)  # beyond 61440: 1e30, +-inf


def _same(got: List[float], wanted: List[float]) -> bool:
    return all((g != g and w != w) or (g == w and math.copysign(1, g) == math.copysign(1, w))
               for g, w in zip(got, wanted))


def wrong_fp8_answer(quant: Callable[..., int], amax_of: Callable[..., int], quant_scaled: Callable[..., int],
                     quant_cols: Callable[..., int], quant_both: Callable[..., int]) -> str:
    """'' when the FP8 kernel rounds, counts and finds the amax of each format's probe (alone and
    repeated to :data:`TILED` values, so the vector loops and the tail both see every value), and
    the block amax and dequantizing scales agree, and column blocks give the transposed row
    blocks' values, and both in one call give what two give, else what it got wrong."""
    for fmt in (0, 1):
        values, expected, (sat, flush) = fp8_probe(fmt)
        repeat = -(-TILED // len(values))
        for given, wanted, times in ((values, expected, 1), ((values * repeat)[:TILED], (expected * repeat)[:TILED],
                                                            None)):
            n = len(given)
            src, dst = (ctypes.c_float * n)(*given), (ctypes.c_float * n)()
            scale, counts, amax = (ctypes.c_float * 1)(1.0), (ctypes.c_int64 * 2)(), (ctypes.c_float * 1)()
            if quant(ctypes.addressof(src), ctypes.addressof(dst), 1, n, 1, n, ctypes.addressof(scale), fmt, 0,
                     ctypes.addressof(counts), ctypes.addressof(amax)) != 0:
                return f"format {fmt}: refused"
            copies = times or n // len(values)
            extra = given[copies * len(values):] if times is None else []
            want_counts = [sat * copies + sum(1 for v in extra if _saturates(v, fmt)),
                           flush * copies + sum(1 for v in extra if _flushes(v, fmt))]
            if not _same(list(dst), wanted) or list(counts) != want_counts or amax[0] != float("inf"):
                return f"format {fmt}, {n} values: {list(dst)}, counts {list(counts)}, amax {amax[0]}"
    # two 1x2 blocks with scales 2 and 0.5, dequantized; their amax blocks
    src = (ctypes.c_float * 4)(3.0, -0.3, 100.0, float("nan"))
    dst, scale = (ctypes.c_float * 4)(), (ctypes.c_float * 2)(2.0, 0.5)
    counts, amax, blocks = (ctypes.c_int64 * 2)(), (ctypes.c_float * 1)(), (ctypes.c_float * 2)()
    quant(ctypes.addressof(src), ctypes.addressof(dst), 1, 4, 1, 2, ctypes.addressof(scale), 0, 1,
          ctypes.addressof(counts), ctypes.addressof(amax))
    amax_of(ctypes.addressof(src), 2, 2, 2, 1, ctypes.addressof(blocks))  # as 2x2 in 2x1 blocks: per column
    if (list(dst)[:3] != [3.0, -0.3125, 96.0] or dst[3] == dst[3] or amax[0] != 100.0
            or list(blocks) != [100.0, ctypes.c_float(0.3).value]):
        return f"blocks: {list(dst)}, amax {amax[0]}, block amax {list(blocks)}"
    # ScaleWrapper: amax 1 -> 256, 3 -> 128 (power of 2: rounded down), 0 -> 1, inf -> 0; 0x1.FEp127
    # without pow2 for an amax whose quotient is inf
    src = (ctypes.c_float * 5)(1.0, 3.0, 0.0, float("inf"), 1e-45)
    for pow2, want in ((1, [256.0, 128.0, 1.0, 0.0, 2.0**127]), (0, [448.0, 448.0 / 3, 1.0, 0.0,
                                                                        float.fromhex("0x1.FEp127")])):
        scales, dst = (ctypes.c_float * 5)(), (ctypes.c_float * 5)()
        quant_scaled(ctypes.addressof(src), ctypes.addressof(dst), 1, 5, 1, 1, ctypes.addressof(scales), 0, 0.0,
                     pow2, 0, ctypes.addressof(counts), ctypes.addressof(amax))
        if list(scales) != [ctypes.c_float(w).value for w in want]:
            return f"scales (pow2={pow2}): {list(scales)} != {want}"
    return _wrong_columns(quant_scaled, quant_cols) or _wrong_both(quant_scaled, quant_cols, quant_both)


def _wrong_columns(quant_scaled: Callable[..., int], quant_cols: Callable[..., int]) -> str:
    """'' when a 3 x 19 array in column blocks of 2 rows (a partial band, NaN, inf, a subnormal)
    gives, with its counts and amax, what its transpose in 1x2 blocks gives, else what differs."""
    rows, cols = 3, 19
    values = [((i * 37) % 23 - 11) * 2.0 ** ((i % 9) - 4) for i in range(rows * cols)]
    values[5], values[20], values[33] = float("nan"), float("inf"), 1e-45
    src, dst = (ctypes.c_float * (rows * cols))(*values), (ctypes.c_float * (rows * cols))()
    flipped = (ctypes.c_float * (rows * cols))(*[values[r * cols + c] for c in range(cols) for r in range(rows)])
    want = (ctypes.c_float * (rows * cols))()
    got_scales, want_scales = (ctypes.c_float * (2 * cols))(), (ctypes.c_float * (cols * 2))()
    counts, want_counts = (ctypes.c_int64 * 2)(), (ctypes.c_int64 * 2)()
    amax, want_amax = (ctypes.c_float * 1)(), (ctypes.c_float * 1)()
    for fmt in (0, 1):
        counts[0] = counts[1] = want_counts[0] = want_counts[1] = 0
        if quant_cols(ctypes.addressof(src), ctypes.addressof(dst), rows, cols, 2, ctypes.addressof(got_scales), fmt,
                      0.0, 1, 1, ctypes.addressof(counts), ctypes.addressof(amax)) != 0:
            return f"columns, format {fmt}: refused"
        quant_scaled(ctypes.addressof(flipped), ctypes.addressof(want), cols, rows, 1, 2, ctypes.addressof(want_scales),
                     fmt, 0.0, 1, 1, ctypes.addressof(want_counts), ctypes.addressof(want_amax))
        got = [dst[r * cols + c] for c in range(cols) for r in range(rows)]
        scales = [got_scales[b * cols + c] for c in range(cols) for b in range(2)]
        if (not _same(got, list(want)) or scales != list(want_scales) or list(counts) != list(want_counts)
                or amax[0] != want_amax[0]):
            return f"columns, format {fmt}: {got} scales {scales} counts {list(counts)} amax {amax[0]}"
    return ""


def _wrong_both(quant_scaled: Callable[..., int], quant_cols: Callable[..., int],
                quant_both: Callable[..., int]) -> str:
    """'' when one ``quant_both`` call on a 5 x 19 array (blocks of 4: partial ones both ways; NaN,
    inf, a subnormal, a saturating value) gives the values, scales, counts and amax of
    ``quant_scaled`` in 1x4 blocks (and their scales' smallest and largest) and the values and
    scales of ``quant_cols`` in 4x1 blocks, else what differs."""
    rows, cols, n = 5, 19, 5 * 19
    values = [((i * 29) % 31 - 15) * 2.0 ** ((i % 11) - 5) for i in range(n)]
    values[3], values[40], values[77], values[90] = float("nan"), float("-inf"), -1e-45, 1e30
    src = (ctypes.c_float * n)(*values)
    for fmt in (0, 1):
        arrays = [(ctypes.c_float * n)() for _ in range(4)]  # rows and columns: got, wanted
        scales = [(ctypes.c_float * (rows * 5))() for _ in range(2)]
        scales += [(ctypes.c_float * (2 * cols))() for _ in range(2)]
        counts, amax = [(ctypes.c_int64 * 2)() for _ in range(3)], [(ctypes.c_float * 1)() for _ in range(3)]
        scale_range = (ctypes.c_float * 2)()
        at = ctypes.addressof
        if quant_both(at(src), at(arrays[0]), at(arrays[2]), rows, cols, 4, at(scales[0]), at(scales[2]), fmt, 0.0, 1,
                      1, at(counts[0]), at(amax[0]), at(scale_range)) != 0:
            return f"both, format {fmt}: refused"
        quant_scaled(at(src), at(arrays[1]), rows, cols, 1, 4, at(scales[1]), fmt, 0.0, 1, 1, at(counts[1]),
                     at(amax[1]))
        quant_cols(at(src), at(arrays[3]), rows, cols, 4, at(scales[3]), fmt, 0.0, 1, 1, at(counts[2]), at(amax[2]))
        for got, wanted in ((arrays[0], arrays[1]), (arrays[2], arrays[3]), (scales[0], scales[1]),
                            (scales[2], scales[3]), (counts[0], counts[1]), (amax[0], amax[1])):
            if not _same(list(got), list(wanted)):
                return f"both, format {fmt}: {list(got)} != {list(wanted)}"
        if list(scale_range) != [min(scales[1]), max(scales[1])]:
            return f"both, format {fmt}: scale range {list(scale_range)}"
    return ""


def _saturates(value: float, fmt: int) -> bool:
    return abs(value) > (464.0 if fmt == 0 else 61440.0)


def _flushes(value: float, fmt: int) -> bool:
    return 0 < abs(value) <= (2.0**-10 if fmt == 0 else 2.0**-17)
