"""``python -m paddle_amp_ext.visualdl_serve --logdir runs``: start VisualDL so every client works.

VisualDL 2.5.3 answers HTTP 500 on ``/app/index`` to clients whose Accept-Language is neither
English nor Chinese (curl sends none), and posts telemetry to an outside host with no timeout.
``--language en --disable-telemetry`` fixes both; this launcher always passes them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import List, Optional, Sequence


def command(logdir: str, host: str = "127.0.0.1", port: int = 8040, language: str = "en") -> List[str]:
    """The visualdl command line that serves ``logdir`` to every client."""
    beside = os.path.join(os.path.dirname(sys.executable), "visualdl")  # this venv's script
    exe = beside if os.path.exists(beside) else shutil.which("visualdl")
    base = [exe] if exe else [sys.executable, "-m", "visualdl.server.app"]
    return base + ["--logdir", logdir, "--host", host, "--port", str(port),
                   "--language", language, "--disable-telemetry"]


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
