"""``python -m paddle_amp_ext.visualdl_serve --logdir runs``: start VisualDL so every client works.

VisualDL 2.5.3 answers HTTP 500 on ``/app/index`` to clients whose Accept-Language is neither
English nor Chinese (curl sends none), and posts telemetry to an outside host with no timeout.
``--language en --disable-telemetry`` fixes both; this launcher always passes them.
"""

from __future__ import annotations

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
    """The ``paddle-amp-visualdl`` command; see :mod:`paddle_amp_ext.visualdl_cli`."""
    from .visualdl_cli import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
