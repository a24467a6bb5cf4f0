"""``python -m paddle_amp_ext.visualdl_serve --logdir runs``: the launcher's command line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from .visualdl_serve import command


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paddle_amp_ext.visualdl_serve",
                                     description="Serve VisualDL logs with settings that work for every client.")
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--host", default="127.0.0.1", help="use 0.0.0.0 inside Docker")
    parser.add_argument("--port", type=int, default=8040)
    parser.add_argument("--language", default="en", choices=("en", "zh"))
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    args = parser.parse_args(argv)
    cmd = command(args.logdir, args.host, args.port, args.language)
    if args.print:
        print(" ".join(cmd))
        return 0
    print(f"Serving {args.logdir} at http://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
