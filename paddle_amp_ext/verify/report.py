"""The ``check --verify`` report: a frozen record, its text and its JSON (no Paddle here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .verdict import Verdict

#: A check's outcome. ``"known"`` is a documented difference that is not a fault (Paddle's CPU
#: ``check_finite_and_unscale`` kernel), ``"skip"`` a check this device cannot run (no bfloat16).
STATUSES = ("pass", "fail", "known", "skip")
_MARK = {"pass": "ok  ", "fail": "FAIL", "known": "note", "skip": "skip"}


@dataclass(frozen=True)
class CheckResult:
    """One check of ``--verify``.

    Attributes:
        name: what was checked, e.g. ``"op dtypes: cnn O1 float16"``.
        status: one of :data:`STATUSES`.
        summary: one line for the text report.
        details: further lines (mismatches, positions).
        data: numbers for ``--json``.
    """

    name: str
    status: str
    summary: str
    details: Tuple[str, ...] = ()
    data: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, received {self.status!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary, "details": list(self.details),
                "data": self.data}


@dataclass(frozen=True)
class VerifyReport:
    """Everything ``--verify`` found, or, without a GPU, what it would check.

    Attributes:
        paddle_version: the installed Paddle.
        device: the GPU checked (``"NVIDIA A100 (CC 8.0)"``), None without one.
        needs_gpu: why nothing ran (no GPU), None when the checks ran.
        plan: the checks, in order, as one line each.
        checks: the results (empty when ``needs_gpu``).
        verdicts: the throughput verdict per model.
        model: the ``--model`` spec, if any.
        elapsed_s: wall time of the checks.
    """

    paddle_version: str
    device: Optional[str]
    needs_gpu: Optional[str]
    plan: Tuple[str, ...]
    checks: Tuple[CheckResult, ...] = ()
    verdicts: Tuple[Verdict, ...] = ()
    model: Optional[str] = None
    elapsed_s: float = 0.0

    @property
    def status(self) -> str:
        """``"needs_gpu"``, ``"failed"`` (a check failed) or ``"passed"``."""
        if self.needs_gpu is not None:
            return "needs_gpu"
        return "failed" if any(c.status == "fail" for c in self.checks) else "passed"

    def to_dict(self) -> dict:
        return {"status": self.status, "paddle_version": self.paddle_version, "device": self.device,
                "needs_gpu": self.needs_gpu, "model": self.model, "plan": list(self.plan),
                "checks": [c.to_dict() for c in self.checks], "verdicts": [v.to_dict() for v in self.verdicts],
                "elapsed_s": self.elapsed_s}


def _mb(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def render_verdict(verdict: Verdict) -> List[str]:
    """The verdict's lines: a table of the configurations, then the reasons."""
    lines = [f"Throughput on {verdict.model}: "
             + (f"AMP pays, {verdict.best} is fastest" if verdict.pays else "AMP does not pay here")]
    lines.append(f"  {'config':<14}{'steps/s':>10}{'spread':>9}{'vs fp32':>9}{'peak memory':>14}")
    for r in verdict.rows:
        lines.append(f"  {r.config:<14}{r.median:>10.1f}{r.spread:>9.0%}{r.speedup:>8.2f}x"
                     f"{_mb(r.peak_memory_bytes):>14}")
    lines += [f"  because {reason}" for reason in verdict.reasons]
    return lines


def render(report: VerifyReport) -> str:
    """The text report."""
    lines = [f"paddle-amp-ext check --verify (Paddle {report.paddle_version})"]
    if report.needs_gpu is not None:
        lines += [f"Needs a CUDA GPU: {report.needs_gpu}. Nothing was run.", "", "On a GPU it would check:"]
        lines += [f"  - {item}" for item in report.plan]
        if report.model:
            lines.append(f"  (--model {report.model} loaded and ran one float32 forward here)")
        return "\n".join(lines)
    lines.append(f"GPU: {report.device}")
    lines.append("")
    for check in report.checks:
        lines.append(f"[{_MARK[check.status]}] {check.name}: {check.summary}")
        lines += [f"         {d}" for d in check.details]
    for verdict in report.verdicts:
        lines.append("")
        lines += render_verdict(verdict)
    failed = sum(c.status == "fail" for c in report.checks)
    lines += ["", f"{len(report.checks)} checks, {failed} failed, in {report.elapsed_s:.1f} s"]
    return "\n".join(lines)
