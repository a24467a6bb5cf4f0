"""The comparisons ``check --verify`` makes, on numpy arrays and plain records only (no Paddle).

Each function takes what a device run produced (Paddle's op-dtype counts, a kernel's outputs, a
rehearsal's outputs) and what the package predicts, and says whether they agree and where not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy

#: Paddle's op-stats columns, in the order of ``core.get_low_precision_op_list()``'s strings.
STAT_COLUMNS = ("float16", "bfloat16", "float32", "other")
#: Casts that AMP itself inserts: counted by Paddle's statistics, predicted by no list.
CAST_OPS = frozenset({"cast", "transfer_dtype"})
#: The unit roundoff of each low-precision dtype (2**-11 for float16, 2**-8 for bfloat16).
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}


def parse_op_stats(raw: Mapping[str, str]) -> Dict[str, Tuple[int, int, int, int]]:
    """Paddle's op statistics (``{"matmul_v2": "1,0,0,0"}``) as ``{op: (fp16, bf16, fp32, other)}``.

    Raises:
        ValueError: a value is not four comma-separated counts.
    """
    parsed = {}
    for op, text in raw.items():
        parts = str(text).split(",")
        if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"op statistics for {op!r}: expected four counts 'fp16,bf16,fp32,other', "
                             f"received {text!r}")
        parsed[str(op)] = tuple(int(p) for p in parts)  # type: ignore[assignment]
    return parsed


@dataclass(frozen=True)
class OpDtypeComparison:
    """Which ops ran in which dtype, against the op lists' prediction.

    Attributes:
        ran: ``{op: {dtype: calls}}`` for every op Paddle counted (casts left out).
        mismatches: one line per op that ran in a dtype the lists rule out.
    """

    ran: Dict[str, Dict[str, int]]
    mismatches: Tuple[str, ...]

    @property
    def agrees(self) -> bool:
        return not self.mismatches


def compare_op_dtypes(stats: Mapping[str, Sequence[int]], dtype: str, level: str,
                      white: Collection[str], black: Collection[str]) -> OpDtypeComparison:
    """Compare counted op dtypes with the lists: a white op must not run in float32 only; a black
    op must never run in ``dtype``. The same rule at both levels.

    Ops on neither list follow their inputs at O1, so any dtype is right for them. At O2 they run
    in ``dtype`` unless an input is float32 and ``use_promote`` is on (Paddle's rule), which the
    counts cannot tell apart, so they are not judged at O2 either (their counts are in ``ran``).

    Args:
        stats: ``{op: (fp16, bf16, fp32, other)}`` (:func:`parse_op_stats`).
        dtype: ``"float16"`` or ``"bfloat16"``.
        level: ``"O1"`` or ``"O2"``.
        white: the white list in force.
        black: the black list in force.

    Raises:
        ValueError: an unknown dtype or level.
    """
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"dtype must be 'float16' or 'bfloat16', received {dtype!r}")
    if level not in ("O1", "O2"):
        raise ValueError(f"level must be 'O1' or 'O2', received {level!r}")
    low = STAT_COLUMNS.index(dtype)
    ran: Dict[str, Dict[str, int]] = {}
    mismatches: List[str] = []
    for op in sorted(stats):
        if op in CAST_OPS:
            continue
        counts = tuple(int(c) for c in stats[op])
        ran[op] = {name: c for name, c in zip(STAT_COLUMNS, counts) if c}
        if op in black and counts[low]:
            mismatches.append(f"{op}: on the black list, ran {counts[low]}x in {dtype}")
        elif op in white and counts[2] and not counts[low]:
            mismatches.append(f"{op}: on the white list, ran {counts[2]}x in float32 and never in {dtype}")
    return OpDtypeComparison(ran=ran, mismatches=tuple(mismatches))


@dataclass(frozen=True)
class UnscaleComparison:
    """Paddle's ``check_finite_and_unscale`` kernel against the package's emulation of the CUDA one.

    Attributes:
        status: ``"same"``, ``"cpu_zeroing"`` (Paddle's CPU kernel zeroed every tensor from the
            first non-finite one on, its documented difference) or ``"different"``.
        detail: what differed, or what was compared.
    """

    status: str
    detail: str


def _same(a: numpy.ndarray, b: numpy.ndarray) -> bool:
    a = numpy.asarray(a, dtype=numpy.float64)
    b = numpy.asarray(b, dtype=numpy.float64)
    return a.shape == b.shape and bool(numpy.array_equal(a, b, equal_nan=True))


def _zeroed(original: numpy.ndarray, out: numpy.ndarray) -> bool:
    """``out`` is ``original * 0``: 0 where it was finite, NaN where it was inf or NaN."""
    original = numpy.asarray(original, dtype=numpy.float64)
    return _same(out, numpy.where(numpy.isfinite(original), 0.0, numpy.nan))


def compare_unscale(inputs: Sequence[numpy.ndarray], kernel: Sequence[numpy.ndarray], kernel_found: bool,
                    emulated: Sequence[numpy.ndarray], emulated_found: bool) -> UnscaleComparison:
    """Compare, tensor by tensor and bit for bit (NaN equal to NaN), the kernel's outputs and flag
    with the emulation's, on the same ``inputs``.

    Raises:
        ValueError: the three sequences differ in length.
    """
    if not len(inputs) == len(kernel) == len(emulated):
        raise ValueError(f"compare_unscale needs as many outputs as inputs, received {len(inputs)} inputs, "
                         f"{len(kernel)} kernel outputs and {len(emulated)} emulated outputs")
    if bool(kernel_found) != bool(emulated_found):
        return UnscaleComparison("different", f"found_inf: kernel {bool(kernel_found)}, emulation "
                                 f"{bool(emulated_found)}")
    differ = [i for i, (k, e) in enumerate(zip(kernel, emulated)) if not _same(k, e)]
    if not differ:
        return UnscaleComparison("same", f"{len(inputs)} tensors and found_inf={bool(kernel_found)} identical")
    first_bad = next((i for i, x in enumerate(inputs)
                      if not numpy.isfinite(numpy.asarray(x, dtype=numpy.float64)).all()), None)
    if first_bad is not None and differ[0] >= first_bad and all(
            _zeroed(inputs[i], kernel[i]) for i in range(first_bad, len(inputs))):
        return UnscaleComparison("cpu_zeroing", f"tensors {differ} multiplied by 0 from tensor {first_bad} "
                                 "(the first holding inf/NaN) on: Paddle's CPU kernel, not the CUDA one")
    return UnscaleComparison("different", f"tensors {differ} differ")


@dataclass(frozen=True)
class OutputComparison:
    """A rehearsed output against the GPU's, on the same layer, weights and input.

    Attributes:
        max_abs_error: the largest ``|rehearsed - gpu|`` where both are finite (0.0 if none).
        scale: the largest finite ``|gpu|`` (the error is judged relative to it).
        nonfinite_gpu_only: flat positions where only the GPU output is inf/NaN.
        nonfinite_rehearsal_only: flat positions where only the rehearsal's is.
        tolerance: the largest error accepted, ``ulps * unit roundoff * max(scale, 1)``.
    """

    max_abs_error: float
    scale: float
    nonfinite_gpu_only: Tuple[int, ...]
    nonfinite_rehearsal_only: Tuple[int, ...]
    nonfinite_both: int
    tolerance: float

    @property
    def agrees(self) -> bool:
        return not self.nonfinite_gpu_only and not self.nonfinite_rehearsal_only and \
            self.max_abs_error <= self.tolerance


def compare_outputs(gpu: numpy.ndarray, rehearsed: numpy.ndarray, dtype: str, ulps: float = 16.0,
                    limit: int = 8) -> OutputComparison:
    """Compare a rehearsal's output with the GPU's: inf/NaN positions and the error elsewhere.

    Args:
        gpu: the output of the layer under ``auto_cast`` on the GPU.
        rehearsed: the output of the same layer under the rehearsal.
        dtype: the low-precision dtype both ran in (sets the unit roundoff).
        ulps: the error accepted, in units of roundoff of the output's scale (kernels accumulate
            in a different order than the rehearsal's float32 ops).
        limit: at most this many positions listed per side.

    Raises:
        ValueError: the shapes differ, an unknown dtype, or ``ulps`` not a finite number >= 0.
    """
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype must be one of {sorted(UNIT_ROUNDOFF)}, received {dtype!r}")
    if not 0 <= float(ulps) < float("inf"):
        raise ValueError(f"ulps must be a finite number >= 0, received {ulps!r}")
    a = numpy.asarray(gpu, dtype=numpy.float64).ravel()
    b = numpy.asarray(rehearsed, dtype=numpy.float64).ravel()
    if numpy.shape(gpu) != numpy.shape(rehearsed):
        raise ValueError(f"the GPU output has shape {numpy.shape(gpu)}, the rehearsal's "
                         f"{numpy.shape(rehearsed)}: they must match")
    fa, fb = numpy.isfinite(a), numpy.isfinite(b)
    both = fa & fb
    error = float(numpy.max(numpy.abs(a[both] - b[both]))) if both.any() else 0.0
    scale = float(numpy.max(numpy.abs(a[fa]))) if fa.any() else 0.0
    return OutputComparison(
        max_abs_error=error,
        scale=scale,
        nonfinite_gpu_only=tuple(int(i) for i in numpy.flatnonzero(~fa & fb)[:limit]),
        nonfinite_rehearsal_only=tuple(int(i) for i in numpy.flatnonzero(fa & ~fb)[:limit]),
        nonfinite_both=int(numpy.count_nonzero(~fa & ~fb)),
        tolerance=float(ulps) * UNIT_ROUNDOFF[dtype] * max(scale, 1.0),
    )


def scale_backed_off(before: float, after: float, ratio: float = 0.5) -> Optional[str]:
    """None when ``after == before * ratio`` exactly, else what happened instead."""
    if after == before * ratio:
        return None
    return f"the loss scale went from {before} to {after}, expected {before * ratio}"
