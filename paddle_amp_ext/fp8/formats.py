"""The two FP8 formats, float32 -> e4m3fn / e5m2 exactly as CUDA's saturating conversion rounds.

CUDA's ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt)`` (``cuda_fp8.hpp``; the constructors
``__nv_fp8_e4m3(float)`` / ``__nv_fp8_e5m2(float)`` that Paddle's FP8 kernels use call it with
``__NV_SATFINITE``; on sm_89+ it is PTX ``cvt.rn.satfinite.e4m3x2.f32``):

- round to nearest, ties to even, with subnormals (nothing is flushed before rounding);
- a magnitude above the largest finite value *and infinity* become +-max (448 for e4m3fn,
  57344 for e5m2): the header's overflow test ``absx > FP8_OVERFLOW_THRESHOLD`` is true for
  inf, and ``__NV_SATFINITE`` returns ``FP8_MAXNORM`` for it;
- NaN stays NaN; a value that rounds to zero keeps its sign.

Paddle's *CPU* cast to ``float8_e4m3fn`` does not saturate this way (479 -> NaN, 480 -> 448),
so the rehearsal never uses it to round; it only stores values this module already rounded,
which every cast keeps exactly. Pure numpy, vectorized; checked on every float32 bit pattern
against ``ml_dtypes`` (``scripts/check_fp8_rounding.py``, docs/fp8.md).

Example:
    >>> import numpy as np
    >>> quantize(np.array([479.0, 1e30, float("inf"), 2.0**-10], np.float32), "e4m3fn").tolist()
    [448.0, 448.0, 448.0, 0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 format.

    Attributes:
        name: ``"e4m3fn"`` or ``"e5m2"``.
        mantissa_bits: the significand's stored bits (3 or 2).
        min_exponent: the exponent of the smallest normal value, ``2**min_exponent``.
        max: the largest finite value, the saturation bound (448 or 57344).
    """

    name: str
    mantissa_bits: int
    min_exponent: int
    max: float

    @property
    def min_normal(self) -> float:
        """The smallest normal value, ``2**min_exponent``."""
        return 2.0**self.min_exponent

    @property
    def min_subnormal(self) -> float:
        """The smallest subnormal value: below half of it a value rounds to zero."""
        return 2.0 ** (self.min_exponent - self.mantissa_bits)


E4M3FN = Fp8Format("e4m3fn", 3, -6, 448.0)
E5M2 = Fp8Format("e5m2", 2, -14, 57344.0)
FORMATS: Dict[str, Fp8Format] = {"e4m3fn": E4M3FN, "e4m3": E4M3FN, "float8_e4m3fn": E4M3FN,
                                 "e5m2": E5M2, "float8_e5m2": E5M2}


def fp8_format(fmt: object) -> Fp8Format:
    """The :class:`Fp8Format` named by ``fmt`` (``"e4m3fn"``, ``"e4m3"``, ``"e5m2"``, ...).

    Raises:
        ValueError: ``fmt`` names no FP8 format.
    """
    if isinstance(fmt, Fp8Format):
        return fmt
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise ValueError(f"fmt must be one of 'e4m3fn' or 'e5m2' (or 'e4m3', 'float8_e4m3fn', "
                         f"'float8_e5m2'). Received: fmt={fmt!r}")
    return FORMATS[fmt.lower()]


def _constants(spec: Fp8Format) -> Tuple[np.uint32, np.uint32, np.uint32, np.float32]:
    shift = 23 - spec.mantissa_bits
    half_minus_one = np.uint32((1 << (shift - 1)) - 1)
    keep = np.uint32((0xFFFFFFFF << shift) & 0xFFFFFFFF)
    # (a + magic) - magic rounds a < 2**min_exponent to the subnormal quantum, ties to even:
    # magic's float32 ulp is the quantum 2**(min_exponent - mantissa_bits)
    magic = np.float32(2.0 ** (spec.min_exponent - spec.mantissa_bits + 23))
    return np.uint32(shift), half_minus_one, keep, magic


def quantize(x: np.ndarray, fmt: object = "e4m3fn") -> np.ndarray:
    """``x`` rounded to the FP8 format ``fmt`` as CUDA's SATFINITE conversion does, as float32.

    Args:
        x: array-like, converted to float32 (a float32 input is not modified).
        fmt: ``"e4m3fn"`` or ``"e5m2"``.

    Returns:
        A new float32 array of FP8 values: nearest-even rounding, subnormals kept, finite
            values beyond the range and +-inf saturated to +-max, NaN kept.

    Raises:
        ValueError: ``fmt`` names no FP8 format.
    """
    spec = fp8_format(fmt)
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, then +-max
        x = np.asarray(x, dtype=np.float32)
    shift, half_minus_one, keep, magic = _constants(spec)
    size = np.abs(x)
    bits = size.view(np.uint32)
    # round the significand to mantissa_bits, ties to even: add half an ulp minus one plus the
    # kept lowest bit, then cut; a carry moves into the exponent as it should (in place: fewer passes)
    rounded = bits >> shift
    rounded &= np.uint32(1)
    rounded += half_minus_one
    rounded += bits
    rounded &= keep
    with np.errstate(invalid="ignore"):
        small = (size + magic) - magic
        # NaN fails the test and takes the subnormal branch, which keeps it NaN (the bit
        # rounding of a NaN with a small payload would give inf)
        out = np.where(size >= np.float32(spec.min_normal), rounded.view(np.float32), small)
        np.minimum(out, np.float32(spec.max), out=out)  # SATFINITE: inf and overflow -> max; NaN stays
    return np.copysign(out, x, out=out)


def _positive_codes(spec: Fp8Format) -> np.ndarray:
    """The values of the finite non-negative codes 0, 1, 2, ... of ``spec`` (ascending)."""
    m = spec.mantissa_bits
    values = []
    code = 0
    while True:
        exponent, mantissa = code >> m, code & ((1 << m) - 1)
        value = (mantissa * 2.0 ** (spec.min_exponent - m) if exponent == 0
                 else (1 + mantissa / 2**m) * 2.0 ** (exponent - 1 + spec.min_exponent))
        if value > spec.max:
            break
        values.append(value)
        code += 1
    return np.array(values, np.float32)


def to_bits(values: np.ndarray, fmt: object = "e4m3fn") -> np.ndarray:
    """The FP8 bit patterns (uint8) of ``values``, which must be FP8 values already (the output of
    :func:`quantize`); NaN becomes CUDA's NaN (0x7F for e4m3fn, 0x7E for e5m2), the sign kept.

    Raises:
        ValueError: a value is not representable in ``fmt``.
    """
    spec = fp8_format(fmt)
    values = np.asarray(values, np.float32)
    table = _positive_codes(spec)
    size = np.abs(values)
    nan = np.isnan(values)
    code = np.searchsorted(table, np.where(nan, 0, size))
    exact = np.where(nan, True, table[np.minimum(code, table.size - 1)] == size)
    if not exact.all():
        bad = values[~exact].ravel()[0]
        raise ValueError(f"{bad!r} is not an {spec.name} value; round it with quantize() first")
    code = np.where(nan, 0x7F if spec is E4M3FN else 0x7E, code).astype(np.uint8)
    return code | (np.signbit(values).astype(np.uint8) << np.uint8(7))


def overflow_threshold(fmt: object = "e4m3fn") -> float:
    """The magnitude above which only saturation keeps a value finite: max plus half its step
    (464 for e4m3fn, 61440 for e5m2); up to it, rounding alone gives +-max."""
    spec = fp8_format(fmt)
    return spec.max + 2.0 ** (np.floor(np.log2(spec.max)) - spec.mantissa_bits - 1)


def saturated(x: np.ndarray, fmt: object = "e4m3fn") -> np.ndarray:
    """Where ``x`` (float32) is clipped by the saturation: beyond :func:`overflow_threshold`, or +-inf."""
    with np.errstate(invalid="ignore"):
        return np.abs(np.asarray(x, np.float32)) > np.float32(overflow_threshold(fmt))


def flushed(x: np.ndarray, fmt: object = "e4m3fn") -> np.ndarray:
    """Where ``x`` (float32) is nonzero but the conversion rounds it to zero (at most half
    the smallest subnormal: 2**-10 for e4m3fn, 2**-17 for e5m2)."""
    spec = fp8_format(fmt)
    size = np.abs(np.asarray(x, np.float32))
    return (size > 0) & (size <= np.float32(spec.min_subnormal / 2))
