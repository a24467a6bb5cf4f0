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
stderr. These modules are the only ones in the package that print. The helpers they share are in
:mod:`._common` (private); the package exports nothing.
"""

from __future__ import annotations

from typing import List

# cli/doctor.py still imports the shared helpers from here (``from . import fail``)
from ._common import (  # noqa: F401
    FOUND,
    OK,
    SCRIPT_FAILED,
    USAGE,
    UsageError,
    emit,
    fail,
    parse,
    positive_float,
    report_script_end,
)

__all__: List[str] = []
