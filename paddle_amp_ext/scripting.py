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
    """How a script ended: ``exit_code`` as ``python script.py`` would exit (0 normally or for
    ``sys.exit()``, ``n`` for ``sys.exit(n)``, 1 for an exception or for ``sys.exit(obj)`` with
    any other object), the exception it raised (not SystemExit), and ``exit_message``: what
    Python prints on stderr for ``sys.exit(obj)`` (``str(obj)``: ``sys.exit("no data")``,
    ``sys.exit(3.5)``), else None."""

    exit_code: int
    error: Optional[BaseException] = None
    exit_message: Optional[str] = None


def check_script(path: str) -> None:
    """Raise FileNotFoundError naming ``path`` when it is not a file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No such script: {path!r}" + (" (it is a directory)" if os.path.isdir(path) else ""))


def end_of(exc: SystemExit) -> ScriptEnd:
    """The end ``sys.exit(code)`` makes, as Python's own handling of SystemExit: None exits 0,
    an int exits with it, anything else is printed (``str``) and exits 1."""
    code = exc.code
    if code is None:
        return ScriptEnd(0)
    if isinstance(code, int):
        return ScriptEnd(int(code))  # sys.exit(True) is 1
    return ScriptEnd(1, exit_message=str(code))


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
        return end_of(exc)
    except Exception as exc:  # the script failed: the caller reports it
        return ScriptEnd(1, exc)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    return ScriptEnd(0)
