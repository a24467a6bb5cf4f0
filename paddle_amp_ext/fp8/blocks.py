"""Block quantization in one pass: FP8 rounding, saturated/flushed counts and the amax together.

The FP8 linears (:mod:`.linear`) and the emulated ``fp8_quant_blockwise`` (:mod:`.kernels`)
quantize through :func:`quantize_blocks`: an amax per block, a scale per block (Paddle's
``ScaleWrapper``: :func:`scale_from_amax`), ``x * scale`` rounded to FP8
(:func:`.formats.quantize`'s arithmetic), counted and, for the linears, dequantized. The
compiled kernel (``pae_fp8_quant`` / ``pae_fp8_block_amax`` / ``pae_fp8_quant_scaled`` /
``pae_fp8_quant_cols`` / ``pae_fp8_quant_both`` in
``paddle_amp_ext/_native/fp16round.c``, built, cached and trusted with the float16 kernel:
:func:`paddle_amp_ext._native.fp8_kernel`) does the amax, the scales, the rounding and the
counts in one call; where it cannot be had (``PADDLE_AMP_EXT_NATIVE=0``, no compiler, not x86)
numpy computes the same values (checked against each other in ``tests/test_fp8_formats.py``,
and on every float32 pattern by ``scripts/check_fp8_rounding.py --kernel native``).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple, Optional, Tuple

import numpy as np

from .._native import fp8_kernel
from .formats import E4M3FN, Fp8Format, flushed, fp8_format, quantize, saturated

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


def scale_from_amax(amax: np.ndarray, epsilon: float = 0.0, pow2: bool = True, fmt: object = E4M3FN) -> np.ndarray:
    """Paddle's ``ScaleWrapper`` (``fp8_quant_blockwise_kernel.cu``, see :mod:`.kernels`): the
    factor that maps a block of amax ``amax`` onto the range of ``fmt`` (e4m3fn in Paddle's
    kernel; e5m2 for the recipes of :mod:`.linear`), in float32: ``max / fmaxf(amax, epsilon)``,
    1 when that max is 0, ``2**127`` (``pow2``) or ``0x1.FEp127`` when the quotient is inf, and
    with ``pow2`` only the quotient's exponent bits (rounded down to a power of 2)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax_mod = np.fmax(np.asarray(amax, np.float32), np.float32(epsilon))
        scale = np.float32(fp8_format(fmt).max) / amax_mod
        scale = np.where(np.isinf(scale), np.float32(2.0**127 if pow2 else float.fromhex("0x1.FEp127")), scale)
        if pow2:  # keep the exponent bits only: the largest power of 2 not above the quotient
            scale = (scale.astype(np.float32).view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)
        return np.where(amax_mod == 0, np.float32(1.0), scale).astype(np.float32)


def _kernel(use_native: Optional[bool]):
    return fp8_kernel() if use_native is not False else None


def _grid(shape: Tuple[int, int], block: Tuple[int, int]) -> Tuple[int, int]:
    return -(-shape[0] // block[0]), -(-shape[1] // block[1])


def _as_float32_2d(x: np.ndarray) -> np.ndarray:
    if type(x) is np.ndarray and x.dtype == np.float32 and x.ndim == 2 and x.flags.c_contiguous:
        return x  # the FP8 linears' case: no conversion, no floating-point state to save
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, then +-max
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array. Received shape {list(x.shape)}")
    return x


def _check_block(block: object) -> Tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(f"block must be a (rows, cols) tuple of two ints > 0. Received: block={block!r}")
    return int(block[0]), int(block[1])


def block_amax(x: np.ndarray, block: Tuple[int, int], use_native: Optional[bool] = None) -> np.ndarray:
    """The NaN-ignoring amax of ``|x|`` per ``block`` (rows, cols) of the 2-D ``x``; the last
    blocks may be partial. ``use_native=False`` forces numpy (the default uses the kernel where
    it can be had).

    Raises:
        ValueError: ``x`` is not 2-D or ``block`` is not two ints > 0.
    """
    x = _as_float32_2d(x)
    block = _check_block(block)
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
            (:func:`scale_from_amax` with ``epsilon`` and ``pow2``), in the same call.
        fmt: ``"e4m3fn"`` or ``"e5m2"``.
        dequant: multiply each FP8 value by ``1.0f / scale`` (the value a GEMM multiplies).
        use_native: False forces numpy; default: the compiled kernel where it can be had.
        out: where to write the values (C-contiguous float32 shaped like ``x``; may be ``x``
            itself, or a view of a Paddle tensor's memory); default a new array.
        epsilon: lower bound of the amax a computed scale divides by (``scales=None`` only;
            as ``fmaxf``, a NaN or negative one bounds nothing).
        pow2: computed scales rounded down to a power of 2 (``scales=None`` only).

    Raises:
        ValueError: ``x`` is not 2-D, ``block`` is not two ints > 0, ``scales`` or ``out`` has
            the wrong shape or type, ``epsilon`` is not a number, or ``fmt`` names no format.
    """
    spec = fp8_format(fmt)
    x = _as_float32_2d(x)
    block = _check_block(block)
    grid = _grid(x.shape, block)
    if scales is not None:
        scales = np.ascontiguousarray(scales, dtype=np.float32).reshape(-1)
        if scales.size != grid[0] * grid[1]:
            raise ValueError(f"scales has {scales.size} values; expected {grid[0]} x {grid[1]} for blocks of "
                             f"{block} over shape {list(x.shape)}")
        scales = scales.reshape(grid)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise ValueError(f"epsilon must be a number. Received: epsilon={epsilon!r} (of type {type(epsilon).__name__})")
    if out is not None and not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == x.shape
                                and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"out must be a writeable C-contiguous float32 array of shape {list(x.shape)}. Received: "
                         f"{type(out).__name__} {getattr(out, 'dtype', '')} {list(getattr(out, 'shape', []))}")
    # fmaxf(amax, epsilon) with amax >= 0: a NaN or negative epsilon bounds nothing (the C kernel
    # compares, so it gets 0 for those)
    epsilon = float(epsilon) if epsilon > 0 else 0.0
    return quantize_into(x, block, scales, spec, out, dequant, epsilon, bool(pow2), _kernel(use_native))


def quantize_into(x: np.ndarray, block: Tuple[int, int], scales: Optional[np.ndarray], spec: Fp8Format,
                  out: Optional[np.ndarray], dequant: bool, epsilon: float, pow2: bool, kernel,
                  addresses: Optional[Tuple[int, int]] = None) -> Quantized:
    """:func:`quantize_blocks` without its checks, for callers that built every argument right
    (the FP8 linears, once per tensor and step): ``x`` (and ``out``, or None for a new array)
    C-contiguous float32 2-D of one shape, ``block`` two ints > 0, ``scales`` None or float32
    shaped as the block grid, ``epsilon`` a float >= 0, ``kernel`` from
    :func:`paddle_amp_ext._native.fp8_kernel` or None for numpy; ``addresses``: those of ``x``'s
    and ``out``'s first values where the caller has them (views it made), else looked up."""
    grid = (-(-x.shape[0] // block[0]), -(-x.shape[1] // block[1]))
    if kernel is not None and x.size:
        if out is None:
            out = np.empty_like(x)
        src, dst = addresses if addresses is not None else (x.ctypes.data, out.ctypes.data)
        counts, amax = (ctypes.c_int64 * 2)(), ctypes.c_float()  # zeroed; passed as pointers
        if scales is None:  # the kernel writes them
            found = (ctypes.c_float * (grid[0] * grid[1]))()
            if block[1] == 1 and block[0] > 1:  # column blocks: a row at a time, not a call per value
                done = kernel[3](src, dst, x.shape[0], x.shape[1], block[0], found, FORMAT_CODES[spec.name],
                                 epsilon, int(pow2), int(dequant), counts, ctypes.byref(amax))
            else:
                done = kernel[2](src, dst, x.shape[0], x.shape[1], block[0], block[1], found, FORMAT_CODES[spec.name],
                                 epsilon, int(pow2), int(dequant), counts, ctypes.byref(amax))
            if done != 0:
                raise MemoryError(f"the FP8 kernel could not quantize a {list(x.shape)} array in blocks of {block}")
            scales = np.frombuffer(found, np.float32).reshape(grid)
        else:
            kernel[0](src, dst, x.shape[0], x.shape[1], block[0], block[1], scales.ctypes.data,
                      FORMAT_CODES[spec.name], int(dequant), counts, ctypes.byref(amax))
        return Quantized(out, counts[0], counts[1], amax.value, scales)
    if scales is None:
        scales = scale_from_amax(block_amax(x, block, use_native=False), epsilon, pow2, spec)
    per = np.repeat(np.repeat(scales, block[0], axis=0), block[1], axis=1)[:x.shape[0], :x.shape[1]]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scaled = x * per
        values = quantize(scaled, spec)
        if dequant:
            values *= np.float32(1.0) / per
    amax = float(np.fmax.reduce(np.abs(x), axis=None, initial=np.float32(0.0))) if x.size else 0.0
    if out is not None:
        out[...] = values
        values = out
    return Quantized(values, int(saturated(scaled, spec).sum()), int(flushed(scaled, spec).sum()), amax, scales)


def quantize_both(x: np.ndarray, block: int, spec: Fp8Format, out_rows: np.ndarray, out_cols: np.ndarray,
                  epsilon: float, pow2: bool, kernel, addresses: Optional[Tuple[int, int, int]] = None
                  ) -> Tuple[Quantized, Optional[Tuple[float, float]]]:
    """:func:`quantize_into` of ``x`` twice, dequantized, each block's scale from its amax: in
    1 x ``block`` blocks into ``out_rows`` and in ``block`` x 1 blocks into ``out_cols`` (what the
    blockwise recipe needs of an input and an output gradient), in one call of the kernel where
    it can be had. Arguments as :func:`quantize_into`'s (``x`` not empty, ``out_rows`` and
    ``out_cols`` not ``x``; ``addresses``: those of ``x``, ``out_rows`` and ``out_cols``).

    Returns:
        The rows' :class:`Quantized` (the columns' values are in ``out_cols``; their counts are
        not kept: the same values, counted once) and the smallest and largest of the rows' scales
        (None without the kernel).
    """
    if kernel is None:
        quantize_into(x, (block, 1), None, spec, out_cols, True, epsilon, pow2, None)
        return quantize_into(x, (1, block), None, spec, out_rows, True, epsilon, pow2, None), None
    src, dst_rows, dst_cols = addresses if addresses is not None else (x.ctypes.data, out_rows.ctypes.data,
                                                                      out_cols.ctypes.data)
    rows, cols = x.shape
    scales_rows = (ctypes.c_float * (rows * -(-cols // block)))()
    scales_cols = (ctypes.c_float * (-(-rows // block) * cols))()
    counts, amax, scale_range = (ctypes.c_int64 * 2)(), ctypes.c_float(), (ctypes.c_float * 2)()
    if kernel[4](src, dst_rows, dst_cols, rows, cols, block, scales_rows, scales_cols, FORMAT_CODES[spec.name],
                 epsilon, int(pow2), 1, counts, ctypes.byref(amax), scale_range) != 0:
        raise MemoryError(f"the FP8 kernel could not quantize a {list(x.shape)} array in blocks of {block}")
    scales = np.frombuffer(scales_rows, np.float32).reshape(rows, -(-cols // block))
    return Quantized(out_rows, counts[0], counts[1], amax.value, scales), (scale_range[0], scale_range[1])
