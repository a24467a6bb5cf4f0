"""``VisualDLHook``: the scaler hook, and where a run's records go (``logdir/RUN[/rankN]``)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any, List, Optional, Tuple

import paddle

from .._log import logger, warn_once
from ..dashboards import backends, metrics
from ..events import StepEvent
from ..fp8.stats import Fp8Stats
from . import flusher, records, shutdown
from .steps import MAX_STEP, PendingSteps, Row, checked_step
from .targets import has_records as _has_records
from .writer import BatchedWriter

#: Every tag a hook writes, in the order VisualDL's ``amp`` group shows them (the registry's names).
TAGS = metrics.NAMES


def _rank() -> Tuple[int, int]:
    try:
        return paddle.distributed.get_rank(), paddle.distributed.get_world_size()
    except Exception:
        return 0, 1


def _checked_logdir(logdir: Any) -> str:
    """``logdir`` as a path, or a TypeError/ValueError naming it."""
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a directory path such as 'runs/exp1'. Received: logdir={logdir!r} "
                        f"(of type {type(logdir).__name__})")
    path = os.fspath(logdir)
    if not str(path).strip():
        raise ValueError("logdir must be a directory path such as 'runs/exp1'. Received: logdir='' (empty)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"logdir {path!r} is a file, not a directory: pass a directory path.")
    return str(path)


_run_counter = itertools.count()


def run_directory_name() -> str:
    """A new run's directory name: local time, then pid and a counter.

    Runs sort by time, and two hooks started in the same second (in one process or two) never
    share a directory (VisualDL shows only the newest record file of a directory).

    Returns:
        A name such as ``20261130-061910-20001-0``.
    """
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_run_counter)}"


def _log_dir(logdir: Any, all_ranks: bool, run_name: Optional[str] = None) -> Optional[Tuple[str, List[str]]]:
    """Where this rank writes: (``logdir``, [RUN] or [RUN, rankN] with ``all_ranks``), or None."""
    logdir = _checked_logdir(logdir)
    rank, world = _rank()
    if run_name is None:
        run_name = run_directory_name()
        if world > 1 and all_ranks:  # every rank writes into rank 0's run (one collective, at creation)
            names = [run_name]
            paddle.distributed.broadcast_object_list(names, src=0)
            run_name = names[0]
    elif not isinstance(run_name, str) or os.sep in run_name or run_name in (".", ".."):
        raise ValueError(f"run_name must be a directory name (no {os.sep!r}), '' for logdir itself, or None for a "
                         f"new timestamped run. Received: run_name={run_name!r}")
    if world > 1 and all_ranks:
        return logdir, [run_name, f"rank{rank}"] if run_name else [f"rank{rank}"]
    return (logdir, [run_name] if run_name else []) if rank == 0 else None


def _free_run(logdir: str, parts: List[str]) -> List[str]:
    """``parts``, or with the run renamed ``RUN-1``, ``RUN-2``... when its directory already holds
    records: VisualDL shows only the newest record file of a directory, so two writers there
    would be one run on the dashboard, the other hidden."""
    if not _has_records(os.path.join(logdir, *parts)):
        return parts
    if not parts or (len(parts) == 1 and parts[0].startswith("rank")):  # logdir itself: the user asked for it
        warn_once(f"visualdl:shared:{os.path.join(logdir, *parts)}", "VisualDL hook: %s already holds a record file "
                  "and VisualDL shows only the newest one of a directory: the older records will be hidden on the "
                  "dashboard. Pass run_name=None (a new run directory per hook) to keep both.",
                  os.path.join(logdir, *parts))
        return parts
    for n in itertools.count(1):
        renamed = [f"{parts[0]}-{n}"] + parts[1:]
        if not _has_records(os.path.join(logdir, *renamed)):
            logger.warning("VisualDL hook: %s already holds records (another hook or an earlier run with the same "
                           "run_name; VisualDL would show only one of them): this hook writes to %s. Pass another "
                           "run_name, or run_name=None for a new timestamped run.", os.path.join(logdir, *parts),
                           os.path.join(logdir, *renamed))
            return renamed
    raise AssertionError("unreachable")  # pragma: no cover


def open_writers(owner: Any, logdir: Any, all_ranks: bool, run_name: Optional[str], flush_every: int,
                 flush_secs: float, filename_suffix: str = "", report_to: Any = "visualdl") -> List[BatchedWriter]:
    """The writers ``owner`` logs to, one per ``report_to`` backend, all in one run directory (none
    on ranks that do not log), each closed when ``owner`` is garbage-collected or at exit,
    whichever comes first; ``owner.logdir`` is set. Every backend's library is looked for before
    a directory is made."""
    names = backends.parse_report_to(report_to)
    for name in names:
        backends.require(name)
    where = _log_dir(logdir, all_ranks, run_name)  # any collective before the lock: ranks share hosts
    outs: List[BatchedWriter] = []
    if where is not None:
        with records.creating_in(where[0]):  # the check for records and the files' creation: one at a time
            parts = _free_run(*where)
            try:
                for name in names:
                    outs.append(BatchedWriter(where[0], flush_every, flush_secs, filename_suffix, parts, name))
            except BaseException:
                for out in outs:
                    out.close()
                raise
    for out in outs:
        out.close_with(owner)
    if outs:
        logger.info("AMP metrics: logging to %s for %s%s", outs[0].logdir, ", ".join(names),
                    "".join(f"; view with: {backends.view_command(name, str(logdir), outs[0].logdir)}"
                            for name in names))
    owner.logdir = outs[0].logdir if outs else None
    return outs


def add_step(outs: List[BatchedWriter], step: int, rows: List[Row]) -> None:
    """Hand one step to every writer: the same rows list, so its device values are read once
    (the first writer to flush replaces them by host floats in place)."""
    walltime_ms = int(time.time() * 1000)
    for out in outs:
        out.add(step, walltime_ms, rows)


def close_all(outs: List[BatchedWriter]) -> None:
    """Close every writer, also when one of them fails (the first failure is raised after)."""
    failure = None
    for out in outs:
        try:
            out.close()
        except Exception as exc:  # noqa: BLE001 - the other backends still close
            failure = failure or exc
    if failure is not None:
        raise failure


class NotCopyable:
    """Refuses pickling and copying, naming the mistake: a hook or callback owns one run's open
    record file, and a copy would write the same steps twice or into a closed file."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise self._refusal()

    def __copy__(self) -> Any:
        raise self._refusal()

    def __deepcopy__(self, memo: Any) -> Any:
        raise self._refusal()

    def _refusal(self) -> TypeError:
        name = type(self).__name__
        return TypeError(f"A {name} cannot be pickled or copied: it writes one run's open record file "
                         f"({self.logdir!r}), and a copy would write the same steps twice or into a closed file. "
                         f"copy.deepcopy of a GradScaler (or of a hapi Model) copies its hooks too: remove the hook "
                         f"first (scaler.remove_hook(hook)) and give the copy its own {name}; to save or restore a "
                         "scaler, use scaler.state_dict() / set_state_dict().")


class VisualDLHook(NotCopyable):
    """Log loss, loss scale, skips, grad norm and lr to VisualDL (or TensorBoard, SwanLab, W&B) at every step.

    Tags: ``amp/loss``, ``amp/loss_scale`` (the raw scale, e.g. 65536), ``amp/log2_loss_scale``
    (16 for 2**16), ``amp/skipped_steps``, ``amp/grad_norm`` (when the scaler computed it) and
    ``amp/lr``. A loss of several values (per-sample losses) is recorded as its mean. Nothing
    is lost for want of ``close()``: the records are flushed and closed when the hook is
    garbage-collected (with the scaler that holds it), at interpreter exit, on SIGTERM and on
    SIGINT (before a handler of the script's); a background thread writes every step within
    ``flush_secs``, so ``kill -9``, an OOM kill or an abort loses at most the last ``flush_secs``
    of steps (the documentation's "What reaches the records"). A hook cannot be pickled or copied (TypeError).
    ``report_to`` picks the dashboards, all written from one batch of device reads into one run
    directory (the Dashboards page says what holds for each). :meth:`watch_fp8` adds the FP8
    statistics of an ``fp8_linears`` block (``fp8/<layer>/<tensor>/<quantity>``) to every step.

    Args:
        logdir: the VisualDL log directory to serve (``visualdl_serve --logdir LOGDIR``).
        flush_every: fetch device values and write after this many steps (one device read in
            the training thread)...
        flush_secs: ...and a background thread writes what waits once this many seconds have
            passed since the last write (default 1; its device reads are its own, no sync in
            the training thread); ``math.inf``: steps only.
        all_ranks: in data-parallel runs log every rank to ``RUN/rank{N}`` (every rank must create
            the hook: rank 0 tells the others the run's name); default rank 0 only.
        filename_suffix: appended to the record file's name.
        run_name: the run's directory under ``logdir``. Default: a new one named by local time,
            pid and a counter (``20261130-060707-4242-0``), so every hook and every re-run is its
            own run in VisualDL's run list (VisualDL shows only the newest record file of a
            directory); ``""`` writes into ``logdir`` itself. A named run whose directory
            already holds records becomes ``NAME-1``, ``NAME-2``... (with a warning), so two
            runs never hide each other. ``hook.logdir`` says where.
        report_to: the dashboards (PaddleFormers' word): ``"visualdl"`` (default),
            ``"tensorboard"``, ``"swanlab"``, ``"wandb"``, or a list of them (or a comma-separated
            string).

    Raises:
        ValueError, TypeError: a bad ``logdir``, ``run_name``, ``flush_every``, ``flush_secs`` or
            ``report_to``.
        OSError: ``logdir`` cannot be written, or a directory the hook would create is a
            symbolic link (planted in a shared logdir: never followed).
        ImportError: a ``report_to`` backend's library is not installed (the message names the extra).

    Example:
        >>> with VisualDLHook("runs/exp1") as hook:  # doctest: +SKIP
        ...     scaler = paddle_amp_ext.GradScaler(hooks=[hook])
        ...     train(scaler)
    """

    def __init__(self, logdir: str = "runs", *, flush_every: int = 200, flush_secs: float = 1.0,
                 all_ranks: bool = False, filename_suffix: str = "", run_name: Optional[str] = None,
                 report_to: Any = "visualdl") -> None:
        self.logdir: Optional[str] = None
        self._outs = open_writers(self, logdir, all_ranks, run_name, flush_every, flush_secs, filename_suffix,
                                  report_to)
        self._out = self._outs[0] if self._outs else None  # the first backend's writer
        self._closed = False
        self._fp8: Optional[Fp8Stats] = None
        self._fp8_since = 0  # the position in the watched stats' run of records up to which they are written
        self._flush_every = flush_every
        #: the steps not yet handed to the writers (None on a rank that does not log, and after close)
        self._pending: Optional[Any] = None
        if self._outs:
            steps = PendingSteps(self._outs)
            for out in self._outs:
                out.feed_from(steps)
            self._pending = steps.events
        # without a background flusher (none could start) every step asks whether flush_secs have passed
        self._attend_at = flush_every if flusher.alive() or flush_secs == float("inf") else 1

    @property
    def active(self) -> bool:
        """False on ranks that do not log, and after close()."""
        return self._out is not None and not self._out.closed

    def on_step(self, event: StepEvent) -> None:
        """Keep the step's event (one append: its values stay on the device); write after
        ``flush_every`` steps or ``flush_secs``.

        No device-to-host sync on this step unless it is a flush (one read of the buffer).

        Args:
            event: the scaler's or guard's :class:`paddle_amp_ext.StepEvent`.

        Raises:
            TypeError, ValueError: ``event.step`` is not an int >= 0 (nothing is buffered).
        """
        pending = self._pending
        if pending is None:
            self._not_logged(event)
            return
        step = event.step
        if step.__class__ is not int or not 0 <= step <= MAX_STEP:
            checked_step(step)
        fp8 = self._fp8
        pending.append((event, int(time.time() * 1000), None if fp8 is None else self._end_fp8_step(fp8)))
        count = len(pending)
        if count == 1 or count >= self._attend_at:
            self._attend(count)

    def _not_logged(self, event: StepEvent) -> None:
        """A step after close() (warned once), or on a rank that does not log (whose watched FP8
        stats still end their step with the scaler's)."""
        if self._closed:
            warn_once(f"visualdl:closed:{id(self)}", "VisualDLHook(%r).on_step after close(): step %d and later "
                      "steps are not logged. Remove the hook from the scaler or create a new one.",
                      self.logdir, event.step)
        elif self._fp8 is not None:
            self._fp8_since = self._fp8.end_step(self._fp8_since)[1]

    def _end_fp8_step(self, fp8: Fp8Stats) -> Optional[List[Row]]:
        """End the watched stats' step; its rows (host floats already: no device read), or None."""
        values, self._fp8_since = fp8.end_step(self._fp8_since)
        return list(values.items()) or None

    def _attend(self, count: int) -> None:
        """The first step after a flush puts the signal handlers back in front of one the script
        installed since (main thread); ``flush_every`` steps flush, as does any step a writer
        wants flushed (``flush_secs`` with no flusher; in a forked child)."""
        if threading.get_ident() == threading.main_thread().ident:
            shutdown.keep_handlers()
        if count >= self._flush_every or any(out.wants_flush() for out in self._outs):
            self.flush()

    def watch_fp8(self, stats: Optional[Fp8Stats]) -> None:
        """Write the FP8 statistics ``stats`` records at every step from now on; None stops.

        At each step the hook ends the stats' step (:meth:`Fp8Stats.end_step`: do not call
        ``stats.next_step()`` yourself) and writes the records made since the previous step,
        as :meth:`Fp8Stats.scalars` reduces them, at the hook's step number, to every
        ``report_to`` backend: ``fp8/<layer>/<tensor>/saturated``, ``flushed``, ``amax``,
        ``scale_min``, ``scale_max`` (:data:`paddle_amp_ext.dashboards.metrics.FP8_METRICS`).
        A step the scaler skipped gets its records too (they often say why); a step without
        records gets no FP8 tags. The values are host floats (the FP8 linears compute on the
        host): no device read is added.

        Args:
            stats: the :class:`~paddle_amp_ext.fp8.Fp8Stats` that ``fp8_linears`` yields, or None.
                The records of its step in progress are written with the hook's next step (a
                hook attached in the middle of a step, as ``AmpCallback``'s may be, misses none);
                those of steps it ended before (``stats.next_step()``) are not.

        Raises:
            TypeError: ``stats`` is not an ``Fp8Stats`` or None.
            ValueError: the hook is closed, or watches another ``Fp8Stats`` already (record both
                models into one: ``fp8_linears(other_model, stats=stats)``).

        Example:
            >>> with amp.fp8_linears(model, "blockwise") as stats:  # doctest: +SKIP
            ...     hook.watch_fp8(stats)
            ...     train(scaler)
        """
        if stats is None:
            self._fp8 = None
            return
        if not isinstance(stats, Fp8Stats):
            raise TypeError(f"stats must be the Fp8Stats that fp8_linears yields (with amp.fp8_linears(model) as "
                            f"stats: hook.watch_fp8(stats)), or None. Received: {stats!r} (of type "
                            f"{type(stats).__name__})")
        if self._closed:
            raise ValueError(f"VisualDLHook({self.logdir!r}) is closed: it writes no more steps. Create a new hook "
                             "to watch the FP8 stats.")
        if self._fp8 is stats:
            return
        if self._fp8 is not None:
            raise ValueError("This hook watches another Fp8Stats already, whose layers' tags could collide with "
                             "these: record both models into one (fp8_linears(other_model, stats=stats)), or "
                             "stop the first with watch_fp8(None).")
        self._fp8, self._fp8_since = stats, stats.step_start()

    def flush(self) -> None:
        """Write the buffered steps now (one device read)."""
        for out in self._outs:
            out.flush()

    def close(self) -> None:
        """Flush and close; steps after this are not logged. Idempotent."""
        self._closed = True
        self._pending = None
        close_all(self._outs)

    @property
    def dropped_steps(self) -> int:
        """Steps that could not be written (full disk or file-size limit), 0 normally (the most
        any one backend dropped)."""
        return max((out.dropped for out in self._outs), default=0)

    def __enter__(self) -> VisualDLHook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
