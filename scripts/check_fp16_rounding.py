"""Check the rehearsal's float16 and bfloat16 rounding on every float32 bit pattern.

float16: both kernels of :func:`paddle_amp_ext._compat.kernels.round_to_float16`, the compiled
one-pass F16C kernel (where it can be built) and Paddle's thirteen float32 kernels, against
numpy's ``x.astype(float16).astype(float32)``. bfloat16: the one-pass integer kernel
(:func:`~paddle_amp_ext._compat.kernels.round_to_bfloat16`), Paddle's cast pair (where it rounds
to nearest-even, Paddle 3.x) and the float32 arithmetic of
:func:`paddle_amp_ext.rehearsal.rounding.round_exact`, against round-to-nearest-even written on
the bit pattern in numpy's integers. A value counts as right when it equals the reference (nan
for nan). Signed zeros are counted apart: every kernel must keep them except float16's
arithmetic one, which gives +0 for a negative value flushed to zero (documented).

    .venv/bin/python scripts/check_fp16_rounding.py                   # all 2**32 patterns, both dtypes
    .venv/bin/python scripts/check_fp16_rounding.py --step 251        # every 251st pattern
    .venv/bin/python scripts/check_fp16_rounding.py --dtype bfloat16 --kernel native --json
    .venv/bin/python scripts/check_fp16_rounding.py --kernel native --vector-bits 256  # the AVX2 code

Exit code 0: no wrong value and no lost zero sign (but the documented one); 1: some; 2: usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Dict, List

import numpy as np

CHUNK = 1 << 24
KERNELS = ("native", "arithmetic")
DTYPES = ("float16", "bfloat16")
#: Per dtype, the kernels there are ("cast" is Paddle's cast pair, checked where it is exact).
DTYPE_KERNELS = {"float16": KERNELS, "bfloat16": ("native", "cast", "arithmetic")}


def reference(values: np.ndarray, dtype: str = "float16") -> np.ndarray:
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    bits = values.view(np.uint32).astype(np.uint64)  # 64 bits: the carry of 0xffffffff cannot wrap
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), values, nearest)


def rounded(kernel: str, values: np.ndarray, dtype: str = "float16") -> np.ndarray:
    import paddle

    from paddle_amp_ext._compat import kernels
    from paddle_amp_ext.rehearsal.rounding import round_exact

    x = paddle.to_tensor(values)
    if dtype == "float16":
        out = kernels.round_to_float16(x) if kernel == "native" else kernels.round_arithmetic(x)
    elif kernel == "native":
        out = kernels.round_to_bfloat16(x)
    else:
        out = x.astype("bfloat16").astype("float32") if kernel == "cast" else round_exact(x, "bfloat16")
    return out.numpy()


def check(kernels: List[str], step: int = 1, start: int = 0, stop: int = 1 << 32,
          dtype: str = "float16") -> Dict[str, Dict[str, object]]:
    """Per kernel: the number of patterns checked, of wrong values, of lost zero signs, and the
    first few wrong inputs (as hex bit patterns)."""
    report: Dict[str, Dict[str, object]] = {k: {"checked": 0, "wrong": 0, "zero_sign": 0, "examples": []}
                                             for k in kernels}
    for low in range(start, stop, CHUNK * step):
        bits = np.arange(low, min(low + CHUNK * step, stop), step, dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
        expected = reference(values, dtype)
        for kernel in kernels:
            got = rounded(kernel, values, dtype)
            same = (got == expected) | (np.isnan(got) & np.isnan(expected))
            zero_sign = (got == 0) & (np.signbit(got) != np.signbit(expected))
            entry = report[kernel]
            entry["checked"] += int(values.size)
            entry["wrong"] += int((~same).sum())
            entry["zero_sign"] += int(zero_sign.sum())
            if len(entry["examples"]) < 5:
                entry["examples"] += [hex(int(b)) for b in bits[~same][: 5 - len(entry["examples"])]]
    return report


def passed(report: Dict[str, Dict[str, object]], dtype: str = "float16") -> bool:
    """No wrong value, and no lost zero sign but float16's documented one (its arithmetic kernel)."""
    return all(r["wrong"] == 0 and (r["zero_sign"] == 0 or (k, dtype) == ("arithmetic", "float16"))
               for k, r in report.items())


def available(dtype: str, wanted: str) -> List[str]:
    """The kernels to check for ``dtype``: ``wanted`` ("both" for all), less those this machine
    does not have (said on stderr)."""
    from paddle_amp_ext._native import status
    from paddle_amp_ext.rehearsal.rounding import cast_is_exact

    kernels = [k for k in DTYPE_KERNELS[dtype] if wanted in ("both", k)]
    if "native" in kernels and not status().available:
        print(f"native kernel not available: {status()}", file=sys.stderr)
        kernels.remove("native")
    if "cast" in kernels and not cast_is_exact(dtype):
        print(f"Paddle's cast to {dtype} does not round to nearest-even here: not checked", file=sys.stderr)
        kernels.remove("cast")
    return kernels


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=("native", "cast", "arithmetic", "both"), default="both",
                        help="one kernel, or every kernel there is (both)")
    parser.add_argument("--dtype", choices=DTYPES + ("both",), default="both")
    parser.add_argument("--step", type=int, default=1, help="check every STEP-th bit pattern (default: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--vector-bits", type=int, choices=(512, 256, 128),
                        help="cap the native kernel's vectors at this width (default: the widest this CPU has)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    if args.step < 1:
        print(f"--step must be at least 1, got {args.step}", file=sys.stderr)
        return 2
    if args.vector_bits:
        from paddle_amp_ext._native import vector_bits

        print(f"native kernel vectors: at most {vector_bits(args.vector_bits)} bits", file=sys.stderr)
    reports, ok = {}, True
    for dtype in DTYPES if args.dtype == "both" else (args.dtype,):
        kernels = available(dtype, args.kernel)
        if not kernels:
            return 1
        began = time.perf_counter()
        reports[dtype] = report = check(kernels, args.step, dtype=dtype)
        ok = ok and passed(report, dtype)
        if not args.json:
            for kernel, r in report.items():
                print(f"{dtype} {kernel}: {r['checked']} patterns, {r['wrong']} wrong, {r['zero_sign']} zero signs "
                      "differ" + (f"; first wrong: {', '.join(r['examples'])}" if r["examples"] else ""))
            print(f"{time.perf_counter() - began:.0f} s")
    if args.json:
        print(json.dumps(reports))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
