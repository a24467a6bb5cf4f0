"""``python -m paddle_amp_ext.doctor [--dtype D] [--loss-scale S] SCRIPT [ARGS...]`` (also ``paddle-amp-doctor``)."""

from __future__ import annotations

import sys
from typing import List, Optional

from .doctor import LIMITS
from .doctor_script import run_script


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m paddle_amp_ext.doctor [--dtype D] [--loss-scale S] SCRIPT [ARGS...]``.

    Exit codes: 0 nothing overflowed, 1 an overflow was found (the report says where), 2 usage.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m paddle_amp_ext.doctor",
        description="Run a Paddle training script and name the first layer whose forward or "
        "backward value would overflow fp16 (or is already inf/nan).",
    )
    parser.add_argument("--dtype", default="float16", choices=tuple(LIMITS))
    parser.add_argument("--loss-scale", type=float, default=1.0,
                        help="check backward values as if the loss were scaled by this")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    report = run_script(args.script, args.args, args.dtype, args.loss_scale)
    print(report)
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
