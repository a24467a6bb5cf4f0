"""``python -m paddle_amp_ext.check --verify [--model MODULE:FACTORY] [--json]``.

Exit codes (the convention of :mod:`paddle_amp_ext.cli`): 0 every check passed (a "does not pay"
throughput verdict is information, not a failure), 1 a check failed or there is no CUDA GPU to
run them on (nothing was verified, as ``check --require`` answers "not usable" without a GPU),
2 usage error, including a ``--model`` that cannot be imported, built or run once in float32.
"""

from __future__ import annotations

from typing import Optional

from ..verify import ModelError, verify
from ..verify.report import render
from . import FOUND, OK, emit, fail


def run_verify(prog: str, model: Optional[str], as_json: bool) -> int:
    """Run the checks, print the report (text or JSON), return the exit code."""
    try:
        report = verify(model)
    except ModelError as exc:
        return fail(prog, str(exc))
    emit(report.to_dict(), render(report), as_json)
    return OK if report.status == "passed" else FOUND
