"""Block quantization in one pass: FP8 rounding, saturated/flushed counts and the amax together.

The FP8 linears (:mod:`.linear`) quantize every input, weight and output gradient: an amax per
block, a scale per block, ``x * scale`` rounded to FP8 (:func:`.formats.quantize`'s arithmetic),
counted and dequantized. The compiled kernel (``pae_fp8_quant`` / ``pae_fp8_block_amax`` in
``paddle_amp_ext/_native/fp16round.c``, built, cached and trusted with the float16 kernel:
:func:`paddle_amp_ext._native.fp8_kernel`) does the rounding, the counts and the amax in one
pass; where it cannot be had (``PADDLE_AMP_EXT_NATIVE=0``, no compiler, not x86) numpy computes
the same values (checked against each other in ``tests/test_fp8_formats.py``, and on every
float32 pattern by ``scripts/check_fp8_rounding.py --kernel native``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np

from .._native import fp8_kernel
from .formats import flushed, fp8_format, quantize, saturated
from .kernels import scale_from_amax

#: The C kernel's format codes.
FORMAT_CODES = {"e4m3fn": 0, "e5m2": 1}


class Quantized(NamedTuple):
    """``values`` (FP8 values, or dequantized: times 1/scale), how many were ``saturated`` and
    ``flushed`` (of ``x * scale``), the NaN-ignoring ``amax`` of ``|x|`` and the ``scales`` used
    (one per block, float32)."""

    values: np.ndarray
    saturated: int
    flushed: int
    amax: float
    scales: np.ndarray


def _kernel(use_native: Optional[bool]):
    return fp8_kernel() if use_native is not False else None


def _grid(shape: Tuple[int, int], block: Tuple[int, int]) -> Tuple[int, int]:
    return -(-shape[0] // block[0]), -(-shape[1] // block[1])


def _as_float32_2d(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, then +-max
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array. Received shape {list(x.shape)}")
    return x


def block_amax(x: np.ndarray, block: Tuple[int, int], use_native: Optional[bool] = None) -> np.ndarray:
    """The NaN-ignoring amax of ``|x|`` per ``block`` (rows, cols) of the 2-D ``x``; the last
    blocks may be partial. ``use_native=False`` forces numpy (the default uses the kernel where
    it can be had)."""
    x = _as_float32_2d(x)
    grid = _grid(x.shape, block)
    kernel = _kernel(use_native)
    if kernel is not None and x.size:
        out = np.empty(grid, np.float32)
        kernel[1](x.ctypes.data, x.shape[0], x.shape[1], block[0], block[1], out.ctypes.data)
        return out
    padded = np.pad(np.abs(x), ((0, grid[0] * block[0] - x.shape[0]), (0, grid[1] * block[1] - x.shape[1])))
    return np.fmax.reduce(padded.reshape(grid[0], block[0], grid[1], block[1]), axis=(1, 3),
                          initial=np.float32(0.0))


def quantize_blocks(x: np.ndarray, block: Tuple[int, int], scales: Optional[np.ndarray], fmt: object = "e4m3fn",
                    dequant: bool = True, use_native: Optional[bool] = None, out: Optional[np.ndarray] = None,
                    epsilon: float = 0.0, pow2: bool = True) -> Quantized:
    """``x`` (2-D float32) times its block's scale, rounded to ``fmt`` as CUDA's SATFINITE
    conversion does, with the saturated and flushed counts and the amax of ``|x|``.

    Args:
        x: 2-D array (converted to contiguous float32).
        block: (rows, cols) of a block; the last blocks may be partial.
        scales: one float32 scale per block, shaped ``ceil(rows/br) x ceil(cols/bc)``; None:
            each block's from its amax as Paddle's ``ScaleWrapper`` computes it
            (:func:`.kernels.scale_from_amax` with ``epsilon`` and ``pow2``), in the same call.
        fmt: ``"e4m3fn"`` or ``"e5m2"``.
        dequant: multiply each FP8 value by ``1.0f / scale`` (the value a GEMM multiplies).
        use_native: False forces numpy; default: the compiled kernel where it can be had.
        out: where to write the values (C-contiguous float32 shaped like ``x``; may be ``x``
            itself, or a view of a Paddle tensor's memory); default a new array.

    Raises:
        ValueError: ``x`` is not 2-D, ``scales`` or ``out`` has the wrong shape or type, or
            ``fmt`` names no format.
    """
    spec = fp8_format(fmt)
    x = _as_float32_2d(x)
    grid = _grid(x.shape, block)
    kernel = _kernel(use_native)
    if scales is None and (kernel is None or not x.size):
        scales = scale_from_amax(block_amax(x, block, use_native=False), epsilon, pow2, spec)
    auto = scales is None
    scales = np.empty(grid, np.float32) if auto else np.ascontiguousarray(scales, dtype=np.float32).reshape(-1)
    if scales.size != grid[0] * grid[1]:
        raise ValueError(f"scales has {scales.size} values; expected {grid[0]} x {grid[1]} for blocks of {block} "
                         f"over shape {list(x.shape)}")
    if out is not None and not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == x.shape
                                and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"out must be a writeable C-contiguous float32 array of shape {list(x.shape)}. Received: "
                         f"{type(out).__name__} {getattr(out, 'dtype', '')} {list(getattr(out, 'shape', []))}")
    if kernel is not None and x.size:
        out = np.empty_like(x) if out is None else out
        counts, amax = np.zeros(2, np.int64), np.zeros(1, np.float32)
        head = (x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1], block[0], block[1], scales.ctypes.data,
                FORMAT_CODES[spec.name])
        if auto:
            kernel[2](*head, float(epsilon), int(pow2), int(dequant), counts.ctypes.data, amax.ctypes.data)
        else:
            kernel[0](*head, int(dequant), counts.ctypes.data, amax.ctypes.data)
        return Quantized(out, int(counts[0]), int(counts[1]), float(amax[0]), scales.reshape(grid))
    per = np.repeat(np.repeat(scales.reshape(grid), block[0], axis=0), block[1], axis=1)[:x.shape[0], :x.shape[1]]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scaled = x * per
        values = quantize(scaled, spec)
        if dequant:
            values *= np.float32(1.0) / per
    amax = float(np.fmax.reduce(np.abs(x), axis=None, initial=np.float32(0.0))) if x.size else 0.0
    if out is not None:
        out[...] = values
        values = out
    return Quantized(values, int(saturated(scaled, spec).sum()), int(flushed(scaled, spec).sum()), amax,
                     scales.reshape(grid))
