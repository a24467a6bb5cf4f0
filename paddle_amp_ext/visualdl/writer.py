"""Batched scalar writing: a list append per step; the steps reach the OS within ``flush_secs``.

A step's rows are (tag, host float or device tensor). The training thread only appends; the
rows are written (one ``write`` to the operating system) by whichever comes first:

- ``flush_every`` steps (in the training thread: one device read for the whole batch);
- ``flush_secs`` (default 1 s) since the last write, by the background flusher
  (:mod:`.flusher`): it writes the host rows of the waiting steps first, then reads their
  device values (one transfer, in the flusher's thread: the training thread never waits) and
  writes them;
- ``flush()``, ``close()``, interpreter exit, SIGTERM and SIGINT (:mod:`.shutdown`).

A forked child's copy of a writer keeps nothing (the parent writes the file). A step leaves
the queue only once its bytes are in the file: a signal handler raising in the
middle of a flush (a KeyboardInterrupt) loses nothing. A write that fails (a full disk, a
file-size limit) keeps the encoded steps for a retry at the next flush; only those are bounded
(:attr:`BatchedWriter.MAX_BACKLOG`, the oldest dropped first and counted); a healthy flush of
any size writes every step.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import time
import weakref
from typing import Any, List, Sequence

import numpy as np
import paddle

from .._log import logger, warn_once
from . import flusher, shutdown
from .records import split_existing
from .steps import Row
from .targets import open_target

#: a queued step: a plain tuple (step, walltime ms, rows) until encoded; then what the target's encoder
#: made of it (bytes, or a step object for W&B and the libraries), kept so when its write failed
Entry = Any


def _is_encoded(entry: Entry) -> bool:
    return entry.__class__ is not tuple


def check_flush_bounds(flush_every: Any, flush_secs: Any) -> None:
    """Raise ValueError naming a bad ``flush_every`` (int >= 1) or ``flush_secs`` (seconds > 0)."""
    if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
        raise ValueError(f"flush_every must be an int >= 1. Received: flush_every={flush_every!r}")
    if isinstance(flush_secs, bool) or not isinstance(flush_secs, (int, float)) or not flush_secs > 0 \
            or math.isnan(flush_secs):
        raise ValueError(f"flush_secs must be a number of seconds > 0 (math.inf: steps only). "
                         f"Received: flush_secs={flush_secs!r}")


def host_means(array: np.ndarray, dtype: Any) -> List[float]:
    """Per row of ``array`` (one device value a row, flattened), the mean as a Python float.

    bfloat16 arrives from ``Tensor.numpy()`` as its raw uint16 bits: widened to float32 here.
    An empty value has no mean: NaN.
    """
    if dtype == paddle.bfloat16 and array.dtype == np.uint16:
        array = (array.astype(np.uint32) << 16).view(np.float32)
    rows = array.reshape(array.shape[0], -1)
    if rows.shape[1] == 1:
        return rows[:, 0].astype(np.float64).tolist()
    if rows.shape[1] == 0:
        return [math.nan] * rows.shape[0]
    return rows.astype(np.float64).mean(axis=1).tolist()


def read_means(values: List[paddle.Tensor]) -> List[float]:
    """The mean of each device value in ``values`` as a host float, in order: one stack and one
    read in all when they share a dtype and shape (the usual case: every loss and norm a
    0-d float32), else one per shape and dtype (a device-to-host sync each; run it off the
    training thread or once per batch of steps).

    Paddle's ``stack`` refuses values of other shapes (its infermeta) or dtypes (each kernel,
    CPU and GPU, reads every input through ``DenseTensor::data<T>()``, which checks the dtype:
    ``paddle/phi/kernels/{cpu,gpu}/stack_kernel.*``, from reading Paddle's code; seen on the CPU
    with 2.6.2 and 3.3.1) with a ValueError, so they are only compared when it does.
    """
    try:
        stacked = paddle.stack(values)
    except ValueError:
        pass
    else:
        return host_means(stacked.numpy().reshape(len(values), -1), stacked.dtype)
    groups: dict = {}
    for i, value in enumerate(values):
        groups.setdefault((tuple(value.shape), value.dtype), []).append(i)
    means = [math.nan] * len(values)
    for (_, group_dtype), members in groups.items():
        host = paddle.stack([values[i] for i in members]).numpy()
        for i, mean in zip(members, host_means(host.reshape(len(members), -1), group_dtype)):
            means[i] = mean
    return means


def _is_device(value: Any) -> bool:
    return isinstance(value, paddle.Tensor)


class BatchedWriter:
    """Buffers steps of (tag, device-or-host value) rows and writes them to one record file.

    See the module docstring for when steps are written. An open writer sits in
    :mod:`.shutdown`'s exit registry (closed at exit, flushed on SIGTERM and SIGINT) and in the
    background flusher's list until it is closed.

    Args:
        logdir: the user's log directory (followed as given if it is a link).
        flush_every: write after this many steps (one device read in the training thread).
        flush_secs: a step waits at most this long before the background flusher writes it.
        filename_suffix: appended to the record file's name.
        run_parts: the directories below ``logdir`` the hook names (run, rank): created and
            opened without following links.
        backend: where the steps go (a ``report_to`` name: :mod:`.targets`): VisualDL's record
            file, TensorBoard's event file, or SwanLab's or W&B's offline run.
    """

    #: steps whose write failed, kept for a retry (about 150 bytes a step); older ones are dropped, counted
    MAX_BACKLOG = 100_000

    def __init__(self, logdir: str, flush_every: int = 200, flush_secs: float = 1.0, filename_suffix: str = "",
                 run_parts: Sequence[str] = (), backend: str = "visualdl") -> None:
        check_flush_bounds(flush_every, flush_secs)
        self.backend = backend
        self.logdir = os.path.join(logdir, *run_parts)
        self.flush_every = flush_every
        self.flush_secs = float(flush_secs)
        base, missing = split_existing(logdir)
        try:
            self._file, self._encoder = open_target(backend, base, missing + list(run_parts), filename_suffix)
        except OSError as exc:
            raise OSError(exc.errno, f"VisualDL hook cannot write to logdir {self.logdir!r}: {exc.strerror or exc}. "
                          "Pass a writable directory.") from exc
        self._queue: List[Entry] = []  # oldest first; the training thread appends, a flush removes what it wrote
        self._failed = 0  # leading entries of _queue that are the encoded steps of failed writes
        self._due = time.monotonic() + self.flush_secs
        self.last_write = flusher.clock()  # when the flusher last wrote (its own clock)
        self.dropped = 0  # steps given up on (backlog over its bound, or unwritten at close)
        self.closed = False
        self._pid = os.getpid()  # a forked child's copy never writes (the parent writes these steps)
        self._inherited = False  # this is a forked child's copy (see forked())
        self._main = threading.main_thread().ident
        self._sources: List[Any] = []  # PendingSteps whose events this writer's flushes turn into steps first
        shutdown.register(self)
        flusher.watch(self)

    @property
    def path(self) -> str:
        return self._file.path

    @property
    def backlog(self) -> int:
        """Steps whose write failed and that wait for a retry."""
        return self._failed

    @property
    def pending(self) -> int:
        """Steps not yet in the file (also those still waiting in a hook's :class:`.steps.PendingSteps`)."""
        return len(self._queue) + sum(len(source) for source in self._sources)

    def feed_from(self, source: Any) -> None:
        """Turn ``source``'s waiting events into steps (``source.pull()``) at the start of every flush."""
        self._sources.append(source)

    def close_with(self, owner: Any) -> None:
        """Close this writer when ``owner`` (a hook) is garbage-collected without ``close()``."""
        weakref.finalize(owner, self.close).atexit = False  # exit is the registry's

    def forked(self) -> None:
        """In a forked child, right after the fork (:mod:`.shutdown`): this copy never writes (the
        parent writes its file, and the steps queued at the fork), so it keeps nothing."""
        self._inherited = True
        self._queue, self._failed = [], 0
        for source in self._sources:
            source.forked()
        try:
            self._file.close()  # the child's copy of the descriptor (the parent's stays open, its lock held)
        except OSError:  # pragma: no cover - closed already
            pass

    def add(self, step: int, walltime_ms: int, rows: List[Row]) -> None:
        """Buffer one step (one list append); flush at ``flush_every`` steps. In a forked child
        the step is not kept (warned once, see :meth:`forked`)."""
        self.enqueue([(step, walltime_ms, rows)])
        if threading.get_ident() == self._main:
            shutdown.keep_handlers()  # a handler the script installed after the hook: ours goes first again
        if len(self._queue) - self._failed >= self.flush_every or self.wants_flush():
            self.flush()

    def enqueue(self, entries: List[Entry]) -> None:
        """Buffer the steps ``entries`` (``(step, walltime ms, rows)`` each) for the next flush; none
        after :meth:`close`, none in a forked child (warned once)."""
        if self._inherited:
            warn_once(f"visualdl:forked:{id(self)}", "VisualDL hook: steps logged in process %d, a fork of process %d "
                      "that owns %s, are not recorded (the parent writes that file; a copy in the child would "
                      "interleave with it). Create the hook in the child for records of its own.", os.getpid(),
                      self._pid, self.path)
            return
        if not self.closed:
            self._queue += entries

    def wants_flush(self) -> bool:
        """True when the training thread is to flush now whatever the step count: ``flush_secs``
        have passed and no background flusher runs, or this is a forked child's copy (whose
        flush drops the child's steps, saying so once)."""
        return self._inherited or time.monotonic() >= self._due and not flusher.alive()

    def flush(self) -> None:
        """Write what is buffered now (one device read): see :meth:`flush_now`."""
        shutdown.exclusive(self.flush_now)

    def close(self) -> None:
        """Flush and close; later steps are dropped. Idempotent."""
        shutdown.exclusive(self.close_now)

    def flush_now(self) -> None:
        """Read the buffered device values in one transfer and write every buffered step in one
        ``write`` (inside :func:`.shutdown.exclusive` only)."""
        self._pull()
        self._write(self._encode_stacked)

    def flush_on_signal(self) -> None:
        """:meth:`flush_now` for SIGTERM and SIGINT; a library's run (SwanLab, W&B), which writes
        its buffer only when finished, is finished too: the signal usually ends the process, and
        the steps after it (if the script goes on) find the run finished and wait in memory
        (inside :func:`.shutdown.exclusive` only)."""
        self.flush_now()
        signalled = getattr(self._file, "signalled", None)
        if signalled is not None and os.getpid() == self._pid:
            signalled()

    def flush_background(self) -> None:
        """The flusher's write (inside :func:`.shutdown.exclusive`): host rows first, then the
        device values, read in this thread (one stack and one read per shape and dtype; Paddle
        keeps the AMP level and grad mode per thread, so this runs in float32 without autograd
        whatever the training thread is inside); a device that never answers delays only them,
        never the host rows."""
        if self.closed or os.getpid() != self._pid:
            return
        self._pull()
        self._write_host_rows()
        with paddle.no_grad():  # per thread in Paddle, as its AMP state: the training thread's is not touched
            self._write(self._encode_stacked)

    def close_now(self) -> None:
        """Flush, close the file and leave the exit registry (inside :func:`.shutdown.exclusive` only)."""
        if self.closed:
            return
        if self._inherited:  # the parent's file: nothing written here
            self.closed = True
            return
        try:
            self.flush_now()
        finally:
            self._file.close()
            self.closed = True
            shutdown.unregister(self)
            flusher.forget(self)
        unwritten = sum(1 for entry in self._queue if not _is_encoded(entry)) + self._failed
        self.dropped += unwritten
        self._queue, self._failed = [], 0
        if self.dropped:
            logger.warning("VisualDL hook: %d steps could not be written to %s (the disk was full or the file "
                           "size limited); every record in the file is whole.", self.dropped, self.path)

    # ------------------------------------------------------------------ internals
    def _pull(self) -> None:
        """The hooks' waiting events into this writer's queue (and their other writers'), once per flush."""
        for source in self._sources:
            source.pull()

    def _usable(self) -> bool:
        if self.closed or os.getpid() != self._pid:
            return False
        if self._file.removed():
            try:
                old = self._file.reopen()
            except OSError as exc:
                warn_once(f"visualdl:gone:{id(self)}", "VisualDL hook: %s was removed and cannot be re-created "
                          "(%s): steps wait in memory.", self.path, exc)
                return False
            logger.warning("VisualDL hook: %s was removed while the run wrote it (its directory deleted?): "
                           "re-created as %s; the steps written before went with the removed file.", old, self.path)
        return True

    def _write(self, encode: Any) -> None:
        """Write the first ``count`` queue entries; they leave the queue only once written."""
        self._due = time.monotonic() + self.flush_secs
        self.last_write = flusher.clock()
        count = len(self._queue)  # a step another thread adds meanwhile waits for the next flush
        if not count or not self._usable():
            return
        entries = self._queue[:count]
        try:
            chunks = encode(entries)  # a KeyboardInterrupt here leaves the queue as it was
        except Exception as exc:  # a value Paddle cannot read in a batch: each on its own, NaN where it fails
            warn_once(f"visualdl:read:{id(self)}", "VisualDL hook could not read the logged values in one batch "
                      "(%r): read one by one, NaN where a value cannot be read.", exc)
            chunks = self._encode_each(entries)
        try:
            self._file.write(chunks)
        except OSError as exc:
            self._queue[:count] = chunks  # one slice assignment: the steps are now encoded
            excess = count - self.MAX_BACKLOG
            if excess > 0:
                del self._queue[:excess]
                self.dropped += excess
            self._failed = min(count, self.MAX_BACKLOG)
            warn_once(f"visualdl:write:{self.path}", "VisualDL hook could not write to %s (%s): training goes on; "
                      "up to %d steps are kept and written once the disk has room (the steps dropped beyond "
                      "that are counted in hook.dropped_steps).", self.path, exc, self.MAX_BACKLOG)
            return
        del self._queue[:count]
        self._failed = 0

    def _write_host_rows(self) -> None:
        """Write the host rows of waiting steps that also have device rows; keep only the device rows queued.
        Not for a target that takes each step once (a library's run: W&B drops a step logged again)."""
        if getattr(self._file, "whole_steps", False):
            return
        count = len(self._queue)
        split = [(i, entry) for i, entry in enumerate(self._queue[:count])
                 if not _is_encoded(entry) and any(_is_device(v) for _, v in entry[2])
                 and not all(_is_device(v) for _, v in entry[2])]
        if not split or not self._usable():
            return
        chunks = self._encoded([(step, wall, [row for row in rows if not _is_device(row[1])])
                                for _, (step, wall, rows) in split])
        try:
            self._file.write(chunks)
        except OSError:
            return  # the whole steps are written (or kept) by the flush that follows
        for i, (step, wall, rows) in split:
            self._queue[i] = (step, wall, [r for r in rows if _is_device(r[1])])

    def _encode_stacked(self, entries: List[Entry]) -> List[Any]:
        """``entries`` encoded, the device values read in one transfer (one per shape and dtype when
        they differ: :func:`read_means`). They are replaced by host floats in the rows in place
        (idempotent: an interrupted encode leaves rows that encode the same)."""
        tensor = paddle.Tensor
        members = [(rows, j) for entry in entries if entry.__class__ is tuple
                   for rows in (entry[2],) for j, row in enumerate(rows) if isinstance(row[1], tensor)]
        if members:
            means = read_means([rows[j][1] for rows, j in members])
            for (rows, j), value in zip(members, means):
                rows[j] = (rows[j][0], value)
        return self._encoded(entries)

    def _encode_each(self, entries: List[Entry]) -> List[Any]:
        """``entries`` encoded, each device value read on its own (the fallback when a batch
        cannot be stacked), NaN for a value that cannot be read."""
        tensor = paddle.Tensor
        for entry in entries:
            if _is_encoded(entry):
                continue
            rows = entry[2]
            for j, (tag, value) in enumerate(rows):
                if isinstance(value, tensor):
                    try:
                        rows[j] = (tag, host_means(value.numpy().reshape(1, -1), value.dtype)[0])
                    except Exception:  # noqa: BLE001 - one unreadable value never stops the records
                        rows[j] = (tag, math.nan)
        return self._encoded(entries)

    def _encoded(self, entries: List[Entry]) -> List[Any]:
        encode = self._encoder.step
        try:
            return [entry if entry.__class__ is not tuple else encode(*entry) for entry in entries]  # hot: inlined
        except TypeError as exc:  # a value that is no number (a StepEvent built by hand): NaN, never a stuck flush
            warn_once(f"visualdl:nan:{id(self)}", "VisualDL hook: %s; recorded as NaN.", exc)
            return [entry if _is_encoded(entry) else
                    encode(entry[0], entry[1], [(tag, value if isinstance(value, numbers.Real) else math.nan)
                                                for tag, value in entry[2]]) for entry in entries]
