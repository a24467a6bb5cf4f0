"""A finished run's FP8 statistics written to the dashboards at once (``doctor --fp8``'s stats, a test's).

During training the hook writes them step by step (:meth:`.hook.VisualDLHook.watch_fp8`); this
writes the ``fp8/<layer>/<tensor>/<quantity>`` tags of every step an :class:`Fp8Stats` holds
(its kept window: the last ``keep_steps`` steps), at the stats' own step numbers, into a new run
directory, through the same writers.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..fp8.stats import Fp8Stats
from .hook import add_step, close_all, open_writers


class _Run:
    """The owner of the writers: open_writers sets ``logdir`` and closes them when it goes."""

    logdir: Optional[str] = None


def write_fp8_stats(stats: Fp8Stats, logdir: str, *, report_to: Any = "visualdl",
                    run_name: Optional[str] = None) -> Optional[str]:
    """Write every kept step's FP8 tags of ``stats`` (``stats.scalars(step)`` at ``step``) to the dashboards.

    The stats keep the records of their last ``keep_steps`` steps (``Fp8Stats(keep_steps=...)``);
    earlier steps are in ``stats.summary()`` only, and on the dashboards of a hook that watched them.

    Args:
        stats: an :class:`~paddle_amp_ext.fp8.Fp8Stats`, e.g. ``run_script_fp8(...).stats``.
        logdir: the log directory; the run is a new directory in it, as a hook's.
        report_to: the dashboards, as for :class:`~paddle_amp_ext.VisualDLHook`.
        run_name: the run directory's name; default a new timestamped one.

    Returns:
        The run directory written; None when ``stats`` holds no record (nothing is created) or
            on a rank that does not log.

    Raises:
        TypeError: ``stats`` is not an ``Fp8Stats``.
        ValueError, OSError, ImportError: as :class:`~paddle_amp_ext.VisualDLHook` for ``logdir``,
            ``run_name`` and ``report_to``.

    Example:
        >>> run = amp.fp8.run_script_fp8("train.py", [], "delayed")  # doctest: +SKIP
        >>> write_fp8_stats(run.stats, "runs/fp8", report_to="tensorboard")  # doctest: +SKIP
    """
    if not isinstance(stats, Fp8Stats):
        raise TypeError(f"stats must be an Fp8Stats (fp8_linears yields one; run_script_fp8(...).stats). Received: "
                        f"{stats!r} (of type {type(stats).__name__})")
    steps = sorted({record.step for record in list(stats.records)})
    if not steps:
        return None
    owner = _Run()
    outs = open_writers(owner, logdir, False, run_name, 1 << 30, math.inf, report_to=report_to)
    try:
        for step in steps:
            try:
                rows = list(stats.scalars(step).items())
            except ValueError:  # the step left the kept window while a run still going was written
                continue
            if rows:
                add_step(outs, step, rows)
    finally:
        close_all(outs)
    return owner.logdir
