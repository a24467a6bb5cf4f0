"""Check the rehearsal's float16 rounding on every float32 bit pattern against numpy's conversion.

Both kernels of :func:`paddle_amp_ext._compat.kernels.round_to_float16`: the compiled one-pass
F16C kernel (where it can be built) and Paddle's thirteen float32 kernels. A value counts as right
when it equals numpy's ``x.astype(float16).astype(float32)`` (nan for nan). Signed zeros are
counted apart: the F16C kernel must keep them; the arithmetic one gives +0 for a negative value
flushed to zero (documented).

    .venv/bin/python scripts/check_fp16_rounding.py              # all 2**32 patterns, a few minutes
    .venv/bin/python scripts/check_fp16_rounding.py --step 251   # every 251st pattern
    .venv/bin/python scripts/check_fp16_rounding.py --kernel native --json

Exit code 0: no wrong value (and no lost zero sign from the F16C kernel); 1: some; 2: usage.
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


def reference(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return values.astype(np.float16).astype(np.float32)


def rounded(kernel: str, values: np.ndarray) -> np.ndarray:
    import paddle

    from paddle_amp_ext._compat import kernels

    x = paddle.to_tensor(values)
    out = kernels.round_to_float16(x) if kernel == "native" else kernels.round_arithmetic(x)
    return out.numpy()


def check(kernels: List[str], step: int = 1, start: int = 0, stop: int = 1 << 32) -> Dict[str, Dict[str, object]]:
    """Per kernel: the number of patterns checked, of wrong values, of lost zero signs, and the
    first few wrong inputs (as hex bit patterns)."""
    report: Dict[str, Dict[str, object]] = {k: {"checked": 0, "wrong": 0, "zero_sign": 0, "examples": []}
                                             for k in kernels}
    for low in range(start, stop, CHUNK * step):
        bits = np.arange(low, min(low + CHUNK * step, stop), step, dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
        expected = reference(values)
        for kernel in kernels:
            got = rounded(kernel, values)
            same = (got == expected) | (np.isnan(got) & np.isnan(expected))
            zero_sign = (got == 0) & (np.signbit(got) != np.signbit(expected))
            entry = report[kernel]
            entry["checked"] += int(values.size)
            entry["wrong"] += int((~same).sum())
            entry["zero_sign"] += int(zero_sign.sum())
            if len(entry["examples"]) < 5:
                entry["examples"] += [hex(int(b)) for b in bits[~same][: 5 - len(entry["examples"])]]
    return report


def passed(report: Dict[str, Dict[str, object]]) -> bool:
    return all(r["wrong"] == 0 and (k != "native" or r["zero_sign"] == 0) for k, r in report.items())


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=KERNELS + ("both",), default="both")
    parser.add_argument("--step", type=int, default=1, help="check every STEP-th bit pattern (default: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    if args.step < 1:
        print(f"--step must be at least 1, got {args.step}", file=sys.stderr)
        return 2
    from paddle_amp_ext._native import status

    kernels = list(KERNELS) if args.kernel == "both" else [args.kernel]
    if "native" in kernels and not status().available:
        print(f"native kernel not available: {status()}", file=sys.stderr)
        if args.kernel == "native":
            return 1
        kernels.remove("native")
    began = time.perf_counter()
    report = check(kernels, args.step)
    if args.json:
        print(json.dumps(report))
    else:
        for kernel, r in report.items():
            print(f"{kernel}: {r['checked']} patterns, {r['wrong']} wrong, {r['zero_sign']} zero signs differ"
                  + (f"; first wrong: {', '.join(r['examples'])}" if r["examples"] else ""))
        print(f"{time.perf_counter() - began:.0f} s")
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
