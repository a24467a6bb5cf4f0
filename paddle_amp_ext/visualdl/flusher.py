"""The background flusher: every open writer's steps reach the OS within its ``flush_secs``.

One daemon thread for all writers, started with the first and ended when the last is closed
(and at exit, by :mod:`.shutdown`). It wakes at the earliest due time and writes each due
writer's waiting steps (:meth:`.BatchedWriter.flush_background`, under
:func:`.shutdown.exclusive`, so never at the same time as the training thread's own flush),
whether or not another step arrives: a job whose last step is followed by a hung collective
or a dying peer still has that step on disk a ``flush_secs`` later. Its device reads (a
``paddle.stack`` and one ``numpy()`` per shape and dtype, under ``paddle.no_grad()``) run in its
own thread: Paddle keeps the tracer, the AMP level and the grad mode per thread
(``thread_local`` in ``paddle/fluid/imperative/tracer.cc``, from reading Paddle's code), so the
training thread's ``auto_cast`` neither applies to them nor is touched.

It needs the interpreter: a main thread blocked in C code that holds the GIL stops it too
(Paddle's collectives and backward release it; measured on the CPU with gloo). A forked child
(a DataLoader worker) has no flusher and never writes the parent's steps.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, Optional

from .._log import logger
from . import shutdown

_cond = threading.Condition()
_writers: Dict[int, Any] = {}
_thread: Optional[threading.Thread] = None
_stopping = False


def _forget_in_child() -> None:
    global _cond, _thread, _stopping
    _cond, _thread, _stopping = threading.Condition(), None, False
    _writers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


clock = time.monotonic  # the flusher's clock (a test may replace the writer module's ``time``)


def alive() -> bool:
    """True while the flusher thread runs (the training thread then never flushes by time)."""
    thread = _thread
    return thread is not None and thread.is_alive()


def watch(writer: Any) -> None:
    """Write ``writer``'s steps every ``writer.flush_secs`` until :func:`forget`."""
    global _thread, _stopping
    if writer.flush_secs == float("inf"):
        return
    with _cond:
        _writers[id(writer)] = writer
        _stopping = False
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="paddle-amp-ext-visualdl-flusher", daemon=True)
            try:
                _thread.start()
            except RuntimeError as exc:  # pragma: no cover - no threads left: the training thread flushes by time
                logger.info("VisualDL hooks: no background flusher (%r); steps are written when a step is logged.",
                            exc)
                _thread = None
        _cond.notify_all()


def forget(writer: Any) -> None:
    with _cond:
        _writers.pop(id(writer), None)
        _cond.notify_all()


def _run() -> None:
    while True:
        with _cond:
            if _stopping or not _writers:
                return
            writers = list(_writers.values())
            now = clock()
            due = min(w.last_write + w.flush_secs for w in writers)
            if due > now:
                _cond.wait(due - now)
                continue
        for writer in writers:
            if writer.last_write + writer.flush_secs <= clock():
                started = clock()  # the next write is due flush_secs after this one began, not ended
                if writer.pending:
                    try:
                        shutdown.exclusive(writer.flush_background)
                    except Exception as exc:  # a writer's failure never ends the thread
                        logger.warning("VisualDL hook could not write %s: %r", getattr(writer, "path", writer), exc)
                writer.last_write = max(writer.last_write, started)
