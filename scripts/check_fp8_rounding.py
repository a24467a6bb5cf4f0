"""Check paddle_amp_ext.fp8.formats.quantize on every float32 bit pattern against ml_dtypes.

The reference is ml_dtypes' float32 -> float8_e4m3fn / float8_e5m2 conversion (round to nearest
even, subnormals) with CUDA's __NV_SATFINITE applied on top: a non-NaN input whose reference is
NaN, inf or beyond the range becomes +-max. NaN must stay NaN; everything else must match bit for
bit as float32 (so the sign of a zero counts).

``--kernel native`` checks the compiled one-pass kernel (``paddle_amp_ext.fp8.blocks`` with the
kernel of ``paddle_amp_ext._native``) instead of the numpy rounding, its saturated/flushed counts
against the numpy masks too; it fails when the kernel cannot be had.

Usage: python scripts/check_fp8_rounding.py [--formats e4m3fn e5m2] [--chunk-bits 24] [--kernel numpy|native]
       [--progress]
Prints one line per format: patterns checked, mismatches, seconds. Exit 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np

from paddle_amp_ext._native import fp8_kernel, status
from paddle_amp_ext.fp8.blocks import quantize_blocks
from paddle_amp_ext.fp8.formats import flushed, fp8_format, quantize, saturated

REFERENCE = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def reference(x: np.ndarray, name: str) -> np.ndarray:
    spec = fp8_format(name)
    ref = x.astype(REFERENCE[name]).astype(np.float32)
    with np.errstate(invalid="ignore"):
        clip = ~np.isnan(x) & (~np.isfinite(ref) | (np.abs(ref) > spec.max))
    return np.where(clip, np.copysign(np.float32(spec.max), x), ref)


def native(x: np.ndarray, name: str) -> np.ndarray:
    """The compiled kernel's rounding of ``x`` (scale 1, one block), its counts checked too."""
    out = quantize_blocks(x.reshape(1, -1), (1, x.size), np.ones(1, np.float32), name, dequant=False,
                          use_native=True)
    want = (int(saturated(x, name).sum()), int(flushed(x, name).sum()))
    if (out.saturated, out.flushed) != want:
        print(f"{name}: counts {(out.saturated, out.flushed)} != {want} from {x.view(np.uint32)[0]:#010x}")
        raise SystemExit(1)
    return out.values.reshape(-1)


def check(name: str, chunk_bits: int, kernel: str = "numpy", progress: bool = False) -> int:
    step = 1 << chunk_bits
    wrong = 0
    start = time.perf_counter()
    for base in range(0, 1 << 32, step):
        x = np.arange(base, base + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        ours, ref = (quantize(x, name) if kernel == "numpy" else native(x, name)), reference(x, name)
        same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
        if not same.all():
            bad = np.flatnonzero(~same)
            wrong += bad.size
            i = bad[0]
            print(f"{name}: {bad.size} wrong from {base:#010x}, first {x[i]!r}: ours {ours[i]!r}, reference {ref[i]!r}")
        if progress:
            print(f"{name}: patterns {base:#010x}..{base + step - 1:#010x} done, {wrong} wrong so far, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    print(f"{name}: {1 << 32} float32 bit patterns, {wrong} wrong, {time.perf_counter() - start:.0f} s")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["e4m3fn", "e5m2"], choices=sorted(REFERENCE))
    parser.add_argument("--chunk-bits", type=int, default=24)
    parser.add_argument("--kernel", choices=["numpy", "native"], default="numpy")
    parser.add_argument("--progress", action="store_true", help="a line after every chunk")
    args = parser.parse_args()
    if args.kernel == "native" and fp8_kernel() is None:
        print(f"the compiled kernel cannot be had: {status().detail}")
        return 2
    print(f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, kernel {args.kernel}")
    return 1 if sum(check(name, args.chunk_bits, args.kernel, args.progress) for name in args.formats) else 0


if __name__ == "__main__":
    sys.exit(main())
