"""``python -m paddle_amp_ext.visualdl_serve --logdir runs``: start VisualDL so every client works.

VisualDL 2.5.3 answers HTTP 500 on ``/app/index`` to clients whose Accept-Language is neither
English nor Chinese (curl sends none), and posts telemetry to an outside host with no timeout.
``--language en --disable-telemetry`` fixes both; this launcher always passes them. It also
checks what VisualDL would only print before hanging: a port out of range or already in use
exits 2 with the reason. A record file a killed writer left ending in a partial record (which
VisualDL would reject whole) is cut back to its last whole record first
(:func:`paddle_amp_ext.visualdl.repair_records`). The dashboard has no authentication: it binds 127.0.0.1 unless
``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import sys
from typing import List, Optional, Sequence

from ..visualdl.records import repair_records
from . import OK, UsageError, fail, parse

PROG = "python -m paddle_amp_ext.visualdl_serve"


def command(logdir: str, host: str = "127.0.0.1", port: int = 8040, language: str = "en") -> List[str]:
    """The visualdl command line that serves ``logdir`` to every client."""
    beside = os.path.join(os.path.dirname(sys.executable), "visualdl")  # this venv's script
    exe = beside if os.path.exists(beside) else shutil.which("visualdl")
    base = [exe] if exe else [sys.executable, "-m", "visualdl.server.app"]
    return base + ["--logdir", logdir, "--host", host, "--port", str(port),
                   "--language", language, "--disable-telemetry"]


def check_port(host: str, port: int) -> None:
    """Raise UsageError when ``port`` is out of range or ``host:port`` cannot be bound now."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in 1..65535. Received: --port {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r} cannot be resolved: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(address)
        except OSError as exc:
            raise UsageError(f"cannot serve on {host}:{port}: {exc.strerror or exc} (is another dashboard running? "
                             "pick another --port)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Serve VisualDL logs with settings that work for every "
                                     "client. Exit 2 when the port cannot be served.")
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--host", default="127.0.0.1",
                        help="127.0.0.1 (default) keeps the unauthenticated dashboard on this machine")
    parser.add_argument("--port", type=int, default=8040)
    parser.add_argument("--language", default="en", choices=("en", "zh"))
    parser.add_argument("--print", action="store_true", help="print the command (shell-quoted) instead of running it")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = parse(build_parser(), argv)
        cmd = command(args.logdir, args.host, args.port, args.language)
        if args.print:
            print(shlex.join(cmd))
            return OK
        check_port(args.host, args.port)
    except UsageError as exc:
        return fail(PROG, str(exc))
    if not os.path.isdir(args.logdir):
        print(f"{PROG}: warning: --logdir {args.logdir!r} does not exist yet: the dashboard stays empty until a "
              "run writes there.", file=sys.stderr)
    for path in repair_records(args.logdir):
        print(f"{PROG}: repaired {path}: it ended in a partial record (its writer was killed in the middle of a "
              "write), which VisualDL would reject whole; cut back to its last whole record.", file=sys.stderr)
    print(f"Serving {args.logdir} at http://{args.host}:{args.port}/ (Ctrl-C to stop)", flush=True)
    os.execv(cmd[0], cmd)
    return OK  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
