"""``python -m paddle_amp_ext.run [--config amp.toml] [--logdir DIR] SCRIPT [ARGS...]``: an unmodified script, routed.

Runs ``python SCRIPT ARGS`` with ``paddle.amp`` routed to this package (:func:`paddle_amp_ext.routed`):
its scalers are this package's, each with a VisualDL hook under ``--logdir``; its optimizers are
guarded (``--no-guard``); its LR schedulers are held on skipped steps (``--no-lr-hold``);
``--emulate float16`` rehearses its fp16 numerics. A summary goes to stderr at exit (JSON on
stdout with ``--json``); the exit code is the script's (2 for a usage error before it starts).
How the script is started, imported and routed (threads, forks, ``-m``): "Notes for
maintainers" in the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Tuple

from ..run import _session
from ..run._session import read_config
from ._common import UsageError, fail, parse, report_script_end

PROG = "python -m paddle_amp_ext.run"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, usage="%(prog)s [options] SCRIPT [ARGS...] | -m MODULE [ARGS...]",
                                     description="Run an unmodified Paddle training script with paddle.amp "
                                     "routed to paddle_amp_ext: validated op lists, the gate, the non-finite guard "
                                     "and a VisualDL hook on every GradScaler it builds. Exits with the script's code.")
    parser.epilog = ("As python: SCRIPT may be a folder or zip file with a __main__.py, and -m MODULE [ARGS...] "
                     "(after run's own options) runs a module as python -m does.")
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
    parser.add_argument("script", nargs="?", help="the script, as to python: a file, or a folder or zip file with a "
                        "__main__.py (or -m MODULE before the arguments, as python -m)")
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


def check_emulate(emulate: Optional[str], config: Any, path: Optional[str]) -> None:
    """Raise UsageError when ``--emulate`` names another dtype than the config's ``dtype`` key
    (``"auto"`` leaves the choice open: ``--emulate`` makes it)."""
    if emulate and config is not None and "dtype" in config.given and config.dtype not in (emulate, "auto"):
        raise UsageError(f"--emulate {emulate} conflicts with dtype = {config.dtype!r} in the config {path!r}: "
                         f"rehearse the dtype the config trains in (--emulate {config.dtype}), or change the "
                         "config's dtype.")


def split_module(argv: List[str]) -> Tuple[List[str], Optional[str], List[str]]:
    """``run``'s own options, the module of a ``-m MODULE`` (else None) and the module's arguments:
    as with ``python -m``, everything after the module name is the module's."""
    valued = {"--config", "--logdir", "--emulate"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[:i], (argv[i + 1] if i + 1 < len(argv) else ""), argv[i + 2:]
        if arg.startswith("-m") and not arg.startswith("--"):
            return argv[:i], arg[2:], argv[i + 1:]
        if arg == "--" or not arg.startswith("-"):
            break  # the script (everything after it is its own)
        i += 2 if arg in valued else 1
    return argv, None, []


def parse_args(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line, ``-m MODULE [ARGS]`` understood as ``python -m``; raises UsageError."""
    own, module, rest = split_module(list(sys.argv[1:] if argv is None else argv))
    if module is None:
        args = parse(parser, own)
        if args.script is None:
            raise UsageError("give the SCRIPT to run (or -m MODULE), as to python: "
                             f"{PROG} [options] train.py [args...]")
        args.module = None
        return args
    if not module:
        raise UsageError("-m needs a module name, as python's: -m MODULE [args...]")
    args = parse(parser, own)  # split_module stopped before any script: args.script is None
    args.module, args.args = module, rest
    return args


def main(argv: Optional[List[str]] = None) -> int:
    from ..run import _scripting as scripting
    from ..run._importwatch import when_imported
    from ..run._watch import ChildWatch, StdoutEnd, join_new_threads

    parser = build_parser()
    try:
        args = parse_args(parser, argv)
        if args.module is None:
            scripting.check_script(args.script)
        table, config = read_config(args.config) if args.config else (None, None)
        check_emulate(args.emulate, config, args.config)
        if not args.no_log:
            check_logdir(args.logdir)
            args.report_to = check_report_to(args.report_to)
    except UsageError as exc:
        return fail(PROG, str(exc))
    except (OSError, ValueError, TypeError) as exc:
        return fail(PROG, str(exc))
    if argv is None:
        scripting.claim_start_entry()
    what = args.script if args.module is None else f"-m {args.module}"
    out = StdoutEnd() if args.json else None
    children, threads = ChildWatch(), set(threading.enumerate())
    with contextlib.ExitStack() as stack:
        session = _session.Session(args, table, stack)
        stack.callback(session.close)  # however the script ends (SIGTERM: the hooks flush themselves)
        children.install()  # imports multiprocessing (not paddle)
        from multiprocessing import util as mp_util

        mp_util.register_after_fork(session, _session.Session.in_forked_child)
        stack.callback(children.uninstall)
        try:
            stack.enter_context(when_imported("paddle", session.start))
            if args.module is None:
                end = scripting.run_as_main(args.script, args.args)
            else:
                end = scripting.run_module_as_main(args.module, args.args)
            join_new_threads(threads)  # the routing stays until the script's threads end, as Python waits
        except _session.ConfigRejectedError as exc:
            session.rejected = str(exc)
        except scripting.NothingToRunError as exc:
            return fail(PROG, str(exc))
    if session.rejected is not None:
        if out is not None:
            out.close()
        return fail(PROG, session.rejected)
    report_script_end(end.error, end.exit_message)
    if os.getpid() != session.pid:  # a child the script forked returns here too: the parent reports
        if out is not None:
            out.close()
        return end.exit_code
    summary = {"script": what, "exit_code": end.exit_code, "routed": session.routing is not None,
               "scalers": [s.to_dict() for s in session.summaries],
               "guards": [s.to_dict() for s in session.guard_summaries if s.steps],
               "lr_steps_held": session.routing.lr_steps_held if session.routing is not None else 0,
               "lr_hold": not args.no_lr_hold, "guard_optimizers": not args.no_guard,
               "child_processes": children.total, "forked_child_processes": children.forked,
               "unrouted_child_processes": children.unrouted}
    if out is not None:
        if not out.write_line(json.dumps(summary)):
            _say(f"{PROG}: warning: no stdout for the --json summary (the script's stdout was closed "
                 f"before run started); it is: {json.dumps(summary)}")
    else:
        _say(_render(summary))
    if session.routing is None and "paddle" in sys.modules:
        _say(f"{PROG}: warning: {_NEVER_ROUTED}")
    if not summary["scalers"] and not summary["guards"] and children.unrouted:
        _say(f"{PROG}: warning: {_UNROUTED_CHILDREN.format(n=children.unrouted)}")
    return end.exit_code


def _say(text: str) -> None:
    """Print ``text`` on stderr; on the original stderr when the script closed or replaced ``sys.stderr`` badly."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            print(text, file=stream, flush=True)
            return
        except (ValueError, OSError, AttributeError):
            continue
    try:
        os.write(2, (text + "\n").encode("utf-8", "replace"))
    except OSError:
        pass  # no stderr at all: nothing to tell


_UNROUTED_CHILDREN = ("the script started {n} child process(es) with the spawn or forkserver start method and built "
                      "no GradScaler in this one: a spawned child is a new interpreter, not routed (fork children "
                      "are), and none built in a child is counted here. Build the scalers in the main process "
                      "(threads are routed), start the children with fork, or run the child's training as its own "
                      "`python -m paddle_amp_ext.run` command.")
_NEVER_ROUTED = ("the routing never started: the script imported paddle with run's import watch gone from "
                 "sys.meta_path (it removed or replaced it), so paddle.amp stayed Paddle's own and any GradScaler "
                 "it built was neither routed nor counted. Leave sys.meta_path's first entries in place.")


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
    if summary["forked_child_processes"]:
        lines.append(f"  {summary['forked_child_processes']} fork-started child process(es): routed; what they built "
                     "is not counted here (their VisualDL runs are under the logdir).")
    if summary["lr_steps_held"]:
        lines.append(f"  LR scheduler: {summary['lr_steps_held']} lr.step() call(s) held after skipped steps "
                     "(--no-lr-hold lets them advance).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
