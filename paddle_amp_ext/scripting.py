"""Run a Python script as ``python script.py args...`` would, inside this process.

Shared by ``python -m paddle_amp_ext.doctor`` and ``python -m paddle_amp_ext.run``: the script
runs as ``__main__`` with ``sys.argv`` set and its folder first on ``sys.path`` (so its own
modules import), and however it ends the caller gets its exit code back.
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class ScriptEnd:
    """How a script ended: ``exit_code`` as ``python script.py`` would exit (0 normally, ``n``
    for ``sys.exit(n)``, 1 for an exception), and the exception it raised (not SystemExit)."""

    exit_code: int
    error: Optional[BaseException] = None


def check_script(path: str) -> None:
    """Raise FileNotFoundError naming ``path`` when it is not a file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No such script: {path!r}" + (" (it is a directory)" if os.path.isdir(path) else ""))


def exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1  # sys.exit("message") exits 1, as Python does


def run_as_main(path: str, argv: List[str]) -> ScriptEnd:
    """Run ``path`` as ``__main__``; exceptions other than BaseException stops are caught.

    A ``BaseException`` that is not ``SystemExit`` (KeyboardInterrupt, a caller's stop signal)
    propagates after ``sys.argv`` and ``sys.path`` are restored.

    Raises:
        FileNotFoundError: ``path`` is not a file.
    """
    check_script(path)
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return ScriptEnd(exit_code_of(exc))
    except Exception as exc:  # the script failed: the caller reports it
        return ScriptEnd(1, exc)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    return ScriptEnd(0)
