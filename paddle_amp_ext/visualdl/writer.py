"""Batched scalar writing: a list append per step, one device read and one file write per flush."""

from __future__ import annotations

import math
import time
import weakref
from typing import Any, List, Tuple

import paddle

from .._log import logger, warn_once
from . import shutdown
from .records import RecordFile, ScalarEncoder, require_visualdl

Row = Tuple[str, Any]  # (tag, host float or 1-element device tensor)


def check_flush_bounds(flush_every: Any, flush_secs: Any) -> None:
    """Raise ValueError naming a bad ``flush_every`` (int >= 1) or ``flush_secs`` (seconds > 0)."""
    if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
        raise ValueError(f"flush_every must be an int >= 1. Received: flush_every={flush_every!r}")
    if isinstance(flush_secs, bool) or not isinstance(flush_secs, (int, float)) or not flush_secs > 0 \
            or math.isnan(flush_secs):
        raise ValueError(f"flush_secs must be a number of seconds > 0 (math.inf: steps only). "
                         f"Received: flush_secs={flush_secs!r}")


class BatchedWriter:
    """Buffers steps of (tag, device-or-host value) rows and writes them to one record file.

    A flush happens after ``flush_every`` steps or once ``flush_secs`` have passed since the last
    one, whichever comes first; both are checked when a step is added, on the host clock
    (``time.monotonic``), so no device sync is added. A flush fetches the buffered device values
    in one transfer (a device-to-host sync) and writes them in one batch. An open writer sits in
    :mod:`.shutdown`'s exit registry: closed at exit, flushed on SIGTERM.
    """

    #: encoded steps kept for a retry after a failed write (about 150 bytes a step): 10,000 steps
    MAX_BACKLOG = 10_000

    def __init__(self, logdir: str, flush_every: int = 50, flush_secs: float = 30.0, filename_suffix: str = "") -> None:
        check_flush_bounds(flush_every, flush_secs)
        require_visualdl()
        self.logdir = logdir
        self.flush_every = flush_every
        self.flush_secs = float(flush_secs)
        try:
            self._file = RecordFile(logdir, filename_suffix)
        except OSError as exc:
            raise OSError(exc.errno, f"VisualDL hook cannot write to logdir {logdir!r}: {exc.strerror or exc}. "
                          "Pass a writable directory.") from exc
        self._encoder = ScalarEncoder()
        self._pending: List[Tuple[int, int, List[Row]]] = []  # (step, walltime ms, rows), oldest first
        self._due = time.monotonic() + self.flush_secs
        self._backlog: List[bytes] = []  # encoded steps a failed write left, oldest first
        self.dropped = 0  # steps given up on (backlog over its bound, or unwritten at close)
        self.closed = False
        shutdown.register(self)

    @property
    def path(self) -> str:
        return self._file.path

    def close_with(self, owner: Any) -> None:
        """Close this writer when ``owner`` (a hook) is garbage-collected without ``close()``."""
        weakref.finalize(owner, self.close).atexit = False  # exit is the registry's

    def add(self, step: int, walltime_ms: int, rows: List[Row]) -> None:
        """Buffer one step (one list append); flush when a bound is reached."""
        pending = self._pending
        pending.append((step, walltime_ms, rows))
        if len(pending) >= self.flush_every or time.monotonic() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered now (one device read): see :meth:`flush_now`."""
        shutdown.exclusive(self.flush_now)

    def close(self) -> None:
        """Flush and close; later steps are dropped. Idempotent."""
        shutdown.exclusive(self.close_now)

    def flush_now(self) -> None:
        """Fetch buffered device values in one transfer and write them in one batch (inside
        :func:`.shutdown.exclusive` only).

        A write error (full disk, file-size limit) never reaches the training loop: it is logged
        once, the encoded steps are kept (at most :attr:`MAX_BACKLOG`, oldest dropped first) and
        written at the next flush; what could not be written is reported at close.
        """
        if self.closed:
            return
        self._due = time.monotonic() + self.flush_secs
        count = len(self._pending)  # a step another thread adds meanwhile waits for the next flush
        if count:
            batch = self._pending[:count]
            del self._pending[:count]
            self._backlog.extend(self._encode(batch))
        if not self._backlog:
            return
        if len(self._backlog) > self.MAX_BACKLOG:
            excess = len(self._backlog) - self.MAX_BACKLOG
            self.dropped += excess
            del self._backlog[:excess]
        try:
            self._file.write_bytes(b"".join(self._backlog))
        except OSError as exc:
            warn_once(f"visualdl:write:{self.path}", "VisualDL hook could not write to %s (%s): training goes on; "
                      "up to %d steps are kept and written once the disk has room.", self.path, exc, self.MAX_BACKLOG)
            return
        self._backlog = []

    def close_now(self) -> None:
        """Flush, close the file and leave the exit registry (inside :func:`.shutdown.exclusive` only)."""
        if self.closed:
            return
        try:
            self.flush_now()
        finally:
            self._file.close()
            self.closed = True
            shutdown.unregister(self)
        self.dropped += len(self._backlog)
        self._backlog = []
        if self.dropped:
            logger.warning("VisualDL hook: %d steps could not be written to %s (the disk was full or the file "
                           "size limited); every record in the file is whole.", self.dropped, self.path)

    def _encode(self, batch: List[Tuple[int, int, List[Row]]]) -> List[bytes]:
        """``batch`` as encoded records, one bytes object a step (one device read in all)."""
        groups: dict = {}  # one stack (and one host read) per (shape, dtype), usually one in all
        for i, (_, _, rows) in enumerate(batch):
            for j, (_, value) in enumerate(rows):
                if isinstance(value, paddle.Tensor):
                    groups.setdefault((tuple(value.shape), value.dtype), []).append((i, j, value))
        fetched = {}
        for members in groups.values():
            host = paddle.stack([value for _, _, value in members]).numpy().reshape(len(members), -1)[:, 0]
            fetched.update(zip(((i, j) for i, j, _ in members), host.tolist()))
        encode = self._encoder.step
        return [encode(step, wall, [(tag, fetched.get((i, j), value)) for j, (tag, value) in enumerate(rows)])
                for i, (step, wall, rows) in enumerate(batch)]

