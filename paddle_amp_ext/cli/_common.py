"""What every command shares: exit codes, parsing without exiting, and printing.

The exit codes and ``--json`` convention are on the docs' "Exit codes and --json" page.
"""


from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any, Optional, Sequence

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

