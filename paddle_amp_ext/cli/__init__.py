"""The command-line tools, with one convention for exit codes and ``--json``.

Exit codes, the same in every tool:

- ``0`` (:data:`OK`): done, nothing wrong (``check``: usable; ``doctor``: every value fit).
- ``1`` (:data:`FOUND`): the answer is "no" (``check --require``: not usable; ``check --verify``:
  a check failed, or no GPU to run them on; ``doctor``: an overflow was found).
- ``2`` (:data:`USAGE`): bad input (an unknown flag, a bad value, a missing or unreadable file,
  a port that cannot be served); the message names the input.
- ``3`` (:data:`SCRIPT_FAILED`): ``doctor`` only, the script itself failed (an exception, or a
  non-zero ``sys.exit``) and no overflow was found.

``--json`` prints one JSON document on stdout wherever the output is data; messages go to
stderr. These modules are the only ones in the package that print.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any, List, Optional, Sequence

OK, FOUND, USAGE, SCRIPT_FAILED = 0, 1, 2, 3


class UsageError(Exception):
    """Bad input to a command: printed as ``PROG: error: MESSAGE`` with exit code 2."""


def parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """``parser.parse_args`` that raises :class:`UsageError` instead of exiting (``--help`` still exits 0)."""
    try:
        return parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        raise UsageError("") from None  # argparse already printed the message


def fail(prog: str, message: str) -> int:
    """Print a usage error on stderr and return :data:`USAGE`."""
    if message:
        print(f"{prog}: error: {message}", file=sys.stderr)
    return USAGE


def emit(data: Any, text: str, as_json: bool) -> None:
    """Print ``data`` as JSON, or ``text``, on stdout."""
    print(json.dumps(data, indent=2) if as_json else text, flush=True)


def report_script_end(error: Optional[BaseException], exit_message: Optional[str]) -> None:
    """Print on stderr what ``python script.py`` prints as the script ends: the traceback of the
    exception it raised, or the message of its ``sys.exit(obj)`` (``sys.exit("no data")``
    prints ``no data``, ``sys.exit(3.5)`` prints ``3.5``); nothing for a normal end."""
    if error is not None:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    elif exit_message is not None:
        print(exit_message, file=sys.stderr, flush=True)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


__all__: List[str] = ["FOUND", "OK", "SCRIPT_FAILED", "USAGE", "UsageError", "emit", "fail", "parse",
                      "positive_float", "report_script_end"]
