"""``python -m paddle_amp_ext.run [--config amp.toml] [--logdir DIR] SCRIPT [ARGS...]``: an unmodified script, routed.

Runs a training script as ``python SCRIPT ARGS`` would, with ``paddle.amp`` routed to this
package (:func:`paddle_amp_ext.routed`): every ``paddle.amp.GradScaler`` the script builds is this
package's, with a VisualDL hook writing its own run directory under ``--logdir``, and
``auto_cast``/``decorate`` get the validated lists and the gate; ``--emulate float16`` rehearses
the script's fp16 numerics on any device (:func:`paddle_amp_ext.rehearse`). Every optimizer the
script builds is guarded (a step without a GradScaler skips inf/nan gradients; ``--no-guard``
turns it off), and an LR scheduler bound to an optimizer whose step was skipped does not advance
on the script's own ``lr.step()`` after it, once per skipped step (``--no-lr-hold``; see
:mod:`paddle_amp_ext.lrhold`). At exit a summary (steps,
skipped steps, loss-scale range, where the logs are, the ``lr.step()`` calls held) goes to stderr,
or as JSON to stdout with ``--json``, and the command exits with the script's own code (2 for a usage error before the
script starts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

from . import UsageError, fail, parse, report_script_end

PROG = "python -m paddle_amp_ext.run"


class ScalerSummary:
    """A scaler (or guard) hook that counts steps and skips and keeps the loss-scale range (host values only)."""

    def __init__(self, logdir: Optional[str]) -> None:
        self.logdir = logdir
        self.steps = self.skipped = 0
        self.low = self.high = None

    def on_step(self, event: Any) -> None:
        self.steps += 1
        self.skipped += bool(event.result.skipped)
        scale = event.result.loss_scale
        self.low = scale if self.low is None else min(self.low, scale)
        self.high = scale if self.high is None else max(self.high, scale)

    def to_dict(self) -> Dict[str, Any]:
        return {"steps": self.steps, "skipped": self.skipped, "loss_scale_min": self.low,
                "loss_scale_max": self.high, "logdir": self.logdir}


class LazyVisualDLHook:
    """A :class:`~paddle_amp_ext.VisualDLHook` made at the first step it is told of (a guard whose
    optimizer a scaler steps is never told: it leaves no empty run directory)."""

    def __init__(self, logdir: str, on_made: Any) -> None:
        self._logdir, self._on_made = logdir, on_made
        self.hook: Any = None

    def on_step(self, event: Any) -> None:
        if self.hook is None:
            from ..visualdl import VisualDLHook

            self.hook = VisualDLHook(self._logdir)
            self._on_made(self.hook)
        self.hook.on_step(event)

    def on_overflow(self, event: Any) -> None:
        if self.hook is not None and hasattr(self.hook, "on_overflow"):
            self.hook.on_overflow(event)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Run an unmodified Paddle training script with paddle.amp "
                                     "routed to paddle_amp_ext: validated op lists, the gate, the non-finite guard "
                                     "and a VisualDL hook on every GradScaler it builds. Exits with the script's code.")
    parser.add_argument("--config", metavar="FILE", help="an AmpConfig TOML/JSON file (op lists, dtype, scaler extras)")
    parser.add_argument("--logdir", default="runs", help="VisualDL logs: one run directory per scaler (default runs)")
    parser.add_argument("--no-log", action="store_true", help="no VisualDL hook")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument("--no-lr-hold", action="store_true",
                        help="let an LR scheduler advance on the script's lr.step() after a skipped optimizer step "
                             "(default: held once per skipped step; routed(hold_lr_on_skip=False))")
    parser.add_argument("--no-guard", action="store_true",
                        help="do not guard optimizers stepped without a GradScaler (default: an inf/nan step is "
                             "skipped, one host sync per step; routed(guard_optimizers=False))")
    parser.add_argument("--emulate", choices=("float16", "bfloat16"),
                        help="rehearse the script's AMP numerics on any device: functional ops and nn.Linear are "
                             "rounded as AMP computes them and the GradScaler runs for real (paddle_amp_ext.rehearse)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def check_logdir(logdir: str) -> None:
    """Raise UsageError naming ``logdir`` unless the hooks can write their run directories there.

    Probes for real, as the hooks would write, without leaving anything behind: a temporary
    folder is made and removed in ``logdir``, or in its nearest existing parent when it does not
    exist yet (permission bits alone do not say it: root passes ``os.access`` on a read-only
    file system).
    """
    fix = "pass a writable folder, or --no-log"
    existing = os.path.abspath(logdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == os.path.abspath(logdir) else f"lies under the file {existing!r}"
        raise UsageError(f"--logdir {logdir!r} {where}, not a folder for the VisualDL logs: {fix}.")
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".paddle_amp_ext-probe-", dir=existing))
    except OSError as exc:
        raise UsageError(f"--logdir {logdir!r} is not writable ({existing!r}: {exc.strerror or exc}): {fix}.") from None


def main(argv: Optional[List[str]] = None) -> int:
    from ..config import AmpConfig
    from ..integrations.routing import routed
    from ..scripting import check_script, run_as_main

    parser = build_parser()
    try:
        args = parse(parser, argv)
        check_script(args.script)
        config = AmpConfig.from_file(args.config) if args.config else None
        if not args.no_log:
            check_logdir(args.logdir)
    except UsageError as exc:
        return fail(PROG, str(exc))
    except (OSError, ValueError, TypeError) as exc:
        return fail(PROG, str(exc))
    summaries: List[ScalerSummary] = []
    guard_summaries: List[ScalerSummary] = []
    hooks: List[Any] = []

    def attach(new_scaler: Any) -> None:
        logdir = None
        if not args.no_log:
            from ..visualdl import VisualDLHook

            hooks.append(new_scaler.add_hook(VisualDLHook(args.logdir)))
            logdir = hooks[-1].logdir
        summaries.append(new_scaler.add_hook(ScalerSummary(logdir)))

    def attach_guard(guard: Any) -> None:
        summary = ScalerSummary(None)
        if not args.no_log:
            def made(hook: Any) -> None:
                hooks.append(hook)
                summary.logdir = hook.logdir

            guard.add_hook(LazyVisualDLHook(args.logdir, made))
        guard_summaries.append(guard.add_hook(summary))

    with contextlib.ExitStack() as stack:
        stack.callback(_close_all, hooks)  # however the script ends (SIGTERM: the hooks flush themselves)
        routing = stack.enter_context(routed(config, on_scaler=attach, on_guard=attach_guard,
                                             hold_lr_on_skip=not args.no_lr_hold, guard_optimizers=not args.no_guard))
        if args.emulate:
            from ..rehearsal.emulation import rehearse

            stack.enter_context(rehearse(args.emulate, config=config))
        end = run_as_main(args.script, args.args)
    report_script_end(end.error, end.exit_message)
    summary = {"script": args.script, "exit_code": end.exit_code, "scalers": [s.to_dict() for s in summaries],
               "guards": [s.to_dict() for s in guard_summaries if s.steps], "lr_steps_held": routing.lr_steps_held,
               "lr_hold": not args.no_lr_hold, "guard_optimizers": not args.no_guard}
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(_render(summary), file=sys.stderr, flush=True)
    return end.exit_code


def _close_all(hooks: List[Any]) -> None:
    """Flush and close every VisualDL hook ``run`` attached (one device read each)."""
    for hook in hooks:
        hook.close()


def _render(summary: Dict[str, Any]) -> str:
    lines = [f"paddle_amp_ext.run: {summary['script']} exited with code {summary['exit_code']}."]
    if not summary["scalers"] and not summary["guards"]:
        lines.append("  The script built no paddle.amp.GradScaler.")
    for i, s in enumerate(summary["scalers"]):
        scale = ("loss scale -" if s["loss_scale_min"] is None else
                 f"loss scale {s['loss_scale_min']:g}..{s['loss_scale_max']:g}")
        where = f"; VisualDL logs in {s['logdir']}" if s["logdir"] else ""
        lines.append(f"  GradScaler {i}: {s['steps']} steps, {s['skipped']} skipped, {scale}{where}")
    for i, s in enumerate(summary["guards"]):
        where = f"; VisualDL logs in {s['logdir']}" if s["logdir"] else ""
        lines.append(f"  Optimizer guard {i} (steps without a GradScaler): {s['steps']} steps, {s['skipped']} "
                     f"skipped{where}")
    if summary["lr_steps_held"]:
        lines.append(f"  LR scheduler: {summary['lr_steps_held']} lr.step() call(s) held after skipped steps "
                     "(--no-lr-hold lets them advance).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
