"""``python -m paddle_amp_ext.run``'s session: what it attaches when the script first imports paddle.

The routing (:mod:`.routing`) with a :class:`ScalerSummary` and a VisualDL hook on every
GradScaler and guard the script builds, the rehearsal with ``--emulate``, and the config's op
lists validated at that import (:class:`ConfigRejectedError`: the script stops there). The
command line around it is :mod:`paddle_amp_ext.cli.run`; nothing here prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

_LIST_KEYS = ("custom_white_list", "custom_black_list")


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


class ConfigRejectedError(BaseException):
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


class Session:
    """What ``run`` attaches, set up when the script first imports paddle (see :mod:`._importwatch`)."""

    def __init__(self, args: argparse.Namespace, table: Any, stack: contextlib.ExitStack) -> None:
        self.args, self.table, self.stack = args, table, stack
        self.logdir = None if args.no_log else os.path.abspath(args.logdir)  # before any os.chdir
        self.pid = os.getpid()
        self.summaries: List[ScalerSummary] = []
        self.guard_summaries: List[ScalerSummary] = []
        self.routing: Any = None  # the Routing, once the script has imported paddle
        self.rejected: Optional[str] = None  # the config's op lists were refused at that import
        self.hooks: List[Tuple[int, Any]] = []  # (pid of the process that attached it, hook)

    def start(self, _paddle: Any = None) -> None:
        from . import _deferred

        _deferred.complete()  # the package's names, now that the script has imported paddle
        config = None
        if self.table is not None:
            try:
                config = full_config(self.args.config, self.table)
            except (TypeError, ValueError) as exc:
                self.rejected = str(exc)  # in whichever thread imported paddle: run exits 2 with it
                raise ConfigRejectedError(str(exc)) from None
        from .routing import routed

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
        """Flush and close the VisualDL hooks this process attached (one device read each); idempotent."""
        mine = [hook for pid, hook in self.hooks if pid == os.getpid()]  # a forked child leaves its parent's
        self.hooks = [(pid, hook) for pid, hook in self.hooks if pid != os.getpid()]
        for hook in mine:
            hook.close()

    def in_forked_child(self) -> None:
        """In a ``multiprocessing`` fork child (its after-fork functions): close the hooks the child
        attaches when it ends (``os._exit`` after its exit functions: it never returns through :func:`main`)."""
        from multiprocessing import util

        util.Finalize(self, self.close, exitpriority=10)
