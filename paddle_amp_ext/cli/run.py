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

The script's import order is its own: ``run`` does not import paddle; the routing is put in
place when the script first imports paddle (:mod:`paddle_amp_ext.importwatch`). So ``--config``
is checked up front except its op names, which need Paddle's op registry and are checked at that
import (a bad one stops the script there, exit 2, with the message ``AmpConfig.from_file`` gives).
``--logdir`` is made absolute before the script starts (an ``os.chdir`` in it moves nothing).
Only the process that started prints the summary (a child the script forks returns here too);
scalers built in threads are routed and counted; children started with ``multiprocessing`` are
not counted, and a summary without a scaler says so when the script started any.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

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

    def __init__(self, logdir: str, on_made: Any, report_to: Any = "visualdl") -> None:
        self._logdir, self._on_made, self._report_to = logdir, on_made, report_to
        self.hook: Any = None

    def on_step(self, event: Any) -> None:
        if self.hook is None:
            from ..visualdl import VisualDLHook

            self.hook = VisualDLHook(self._logdir, report_to=self._report_to)
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
    parser.add_argument("--report-to", default="visualdl", metavar="NAMES",
                        help="the dashboards the hooks write, comma-separated: visualdl (default), tensorboard, "
                             "swanlab, wandb (offline runs), all in each run directory")
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


def check_report_to(report_to: str) -> Tuple[str, ...]:
    """``--report-to`` as backend names, or UsageError naming a bad or missing one (its extra)."""
    from ..dashboards import backends

    try:
        names = backends.parse_report_to(report_to)
        for name in names:
            backends.require(name)
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(f"--report-to {report_to!r}: {exc}") from None
    return names


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


class _ConfigRejectedError(BaseException):
    """The config's op lists, validated at the script's first ``import paddle``, are wrong: the
    script stops there (a BaseException passes its ``except Exception``) and ``run`` exits 2."""


def read_config(path: str) -> Tuple[Any, Any]:
    """The settings of ``path`` and an :class:`AmpConfig` of all but the op lists, without paddle.

    Everything is validated but the op names (that needs Paddle's op registry, checked by
    :func:`full_config` when the script imports paddle); the lists' types are checked here.

    Raises:
        FileNotFoundError, ValueError, TypeError: as :meth:`AmpConfig.from_file`, same messages.
    """
    from .. import configfile
    from ..config import AmpConfig, as_op_names

    data = configfile.parse(Path(path))
    try:
        table = configfile.settings_table(data)
        if isinstance(table, Mapping):
            for key in _LIST_KEYS:
                if key in table:
                    as_op_names(key, table[key])
            table = {key: value for key, value in table.items()}
            return table, AmpConfig.from_dict({k: v for k, v in table.items() if k not in _LIST_KEYS})
        return table, AmpConfig.from_dict(table)  # raises: not a table
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"Config file {str(path)!r}: {exc}") from None


def full_config(path: str, table: Any) -> Any:
    """The :class:`AmpConfig` of ``path``'s settings ``table``, op lists validated (imports paddle).

    Raises:
        ValueError, TypeError: as :meth:`AmpConfig.from_file`, same messages.
    """
    from ..config import AmpConfig

    try:
        return AmpConfig.from_dict(table)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"Config file {str(path)!r}: {exc}") from None


def check_emulate(emulate: Optional[str], config: Any, path: Optional[str]) -> None:
    """Raise UsageError when ``--emulate`` names another dtype than the config's ``dtype`` key
    (``"auto"`` leaves the choice open: ``--emulate`` makes it)."""
    if emulate and config is not None and "dtype" in config.given and config.dtype not in (emulate, "auto"):
        raise UsageError(f"--emulate {emulate} conflicts with dtype = {config.dtype!r} in the config {path!r}: "
                         f"rehearse the dtype the config trains in (--emulate {config.dtype}), or change the "
                         "config's dtype.")


class _Session:
    """What ``run`` attaches, set up when the script first imports paddle (see :mod:`..importwatch`)."""

    def __init__(self, args: argparse.Namespace, table: Any, stack: contextlib.ExitStack) -> None:
        self.args, self.table, self.stack = args, table, stack
        self.logdir = None if args.no_log else os.path.abspath(args.logdir)  # before any os.chdir
        self.pid = os.getpid()
        self.summaries: List[ScalerSummary] = []
        self.guard_summaries: List[ScalerSummary] = []
        self.routing: Any = None  # the Routing, once the script has imported paddle
        self.hooks: List[Tuple[int, Any]] = []  # (pid of the process that attached it, hook)
        self.children = _children_started()

    def start(self, _paddle: Any = None) -> None:
        from .. import _deferred

        _deferred.complete()  # the package's names, now that the script has imported paddle
        config = None
        if self.table is not None:
            try:
                config = full_config(self.args.config, self.table)
            except (TypeError, ValueError) as exc:
                raise _ConfigRejectedError(str(exc)) from None
        from ..integrations.routing import routed

        self.routing = self.stack.enter_context(routed(
            config, on_scaler=self.attach, on_guard=self.attach_guard, hold_lr_on_skip=not self.args.no_lr_hold,
            guard_optimizers=not self.args.no_guard))
        if self.args.emulate:
            from ..rehearsal.emulation import rehearse

            self.stack.enter_context(rehearse(self.args.emulate, config=config))

    def attach(self, new_scaler: Any) -> None:
        logdir = None
        if self.logdir is not None:
            from ..visualdl import VisualDLHook

            hook = new_scaler.add_hook(VisualDLHook(self.logdir, report_to=self.args.report_to))
            self.hooks.append((os.getpid(), hook))
            logdir = hook.logdir
        summary = new_scaler.add_hook(ScalerSummary(logdir))
        if os.getpid() == self.pid:
            self.summaries.append(summary)

    def attach_guard(self, guard: Any) -> None:
        summary = ScalerSummary(None)
        if self.logdir is not None:
            def made(hook: Any) -> None:
                self.hooks.append((os.getpid(), hook))  # the process whose guard stepped first
                summary.logdir = hook.logdir

            guard.add_hook(LazyVisualDLHook(self.logdir, made, self.args.report_to))
        guard.add_hook(summary)
        if os.getpid() == self.pid:
            self.guard_summaries.append(summary)

    def close(self) -> None:
        """Flush and close the VisualDL hooks this process attached (one device read each)."""
        for pid, hook in self.hooks:
            if pid == os.getpid():  # a forked child leaves its parent's hooks to the parent
                hook.close()


def main(argv: Optional[List[str]] = None) -> int:
    from ..importwatch import when_imported
    from ..scripting import check_script, run_as_main

    parser = build_parser()
    try:
        args = parse(parser, argv)
        check_script(args.script)
        table, config = read_config(args.config) if args.config else (None, None)
        check_emulate(args.emulate, config, args.config)
        if not args.no_log:
            check_logdir(args.logdir)
            args.report_to = check_report_to(args.report_to)
    except UsageError as exc:
        return fail(PROG, str(exc))
    except (OSError, ValueError, TypeError) as exc:
        return fail(PROG, str(exc))
    with contextlib.ExitStack() as stack:
        session = _Session(args, table, stack)
        stack.callback(session.close)  # however the script ends (SIGTERM: the hooks flush themselves)
        try:
            stack.enter_context(when_imported("paddle", session.start))
            end = run_as_main(args.script, args.args)
        except _ConfigRejectedError as exc:
            return fail(PROG, str(exc))
    report_script_end(end.error, end.exit_message)
    if os.getpid() != session.pid:  # a child the script forked returns here too: the parent reports
        return end.exit_code
    summary = {"script": args.script, "exit_code": end.exit_code,
               "scalers": [s.to_dict() for s in session.summaries],
               "guards": [s.to_dict() for s in session.guard_summaries if s.steps],
               "lr_steps_held": session.routing.lr_steps_held if session.routing is not None else 0,
               "lr_hold": not args.no_lr_hold, "guard_optimizers": not args.no_guard,
               "child_processes": _children_started() - session.children}
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(_render(summary), file=sys.stderr, flush=True)
    if not summary["scalers"] and not summary["guards"] and summary["child_processes"]:
        print(f"{PROG}: warning: {_UNROUTED_CHILDREN.format(n=summary['child_processes'])}", file=sys.stderr,
              flush=True)
    return end.exit_code


_LIST_KEYS = ("custom_white_list", "custom_black_list")
_UNROUTED_CHILDREN = ("the script started {n} child process(es) with multiprocessing and built no GradScaler in "
                      "this one: scalers built in a spawned child are not routed, and none built in a child is "
                      "counted here. Build the scalers in the main process (threads are routed), or run the "
                      "child's training as its own `python -m paddle_amp_ext.run` command.")


def _children_started() -> int:
    """How many ``multiprocessing`` processes this process has created (0 when it never imported
    multiprocessing). Reads ``multiprocessing.process._process_counter`` (an ``itertools.count``
    advanced by each ``Process()``; CPython 3.8-3.13) through its repr, without advancing it."""
    process = sys.modules.get("multiprocessing.process")
    counter = getattr(process, "_process_counter", None)
    try:
        return int(repr(counter)[len("count("):-1]) - 1
    except ValueError:
        return 0


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
