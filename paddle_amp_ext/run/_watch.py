"""What ``python -m paddle_amp_ext.run`` watches around the script: children, threads, stdout.

- :class:`ChildWatch`: the ``multiprocessing`` processes the script starts, by start method. A
  fork child inherits the routing; a spawn or forkserver child is a fresh interpreter, unrouted.
  Paddle's own ``DataLoader`` workers are told apart (they build no scaler).
- :func:`join_new_threads`: waits for the script's non-daemon threads, as the interpreter does
  before it exits, so a training thread that outlives the script's main body stays routed.
- :class:`StdoutEnd`: where the last line of the script's stdout ended, so ``--json`` puts the
  summary on a line of its own on the original stdout (taken before the script ran).

Relies on CPython's ``multiprocessing.process.BaseProcess`` (its ``start()``, the class attribute
``_start_method`` of the context's Process classes and the ``_target`` a Process keeps;
3.8-3.13) and on ``io.TextIOWrapper`` over ``sys.stdout.buffer`` (3.8+).
"""

from __future__ import annotations

import io
import os
import stat
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Set


class ChildWatch:
    """Counts the ``multiprocessing`` children started while :meth:`install`\\ ed (in this process)."""

    def __init__(self) -> None:
        self.started: List[Dict[str, Any]] = []  # {"method": "fork"/"spawn"/"forkserver", "dataloader": bool}
        self._original: Optional[Callable[..., Any]] = None
        self._pid = os.getpid()

    def install(self) -> None:
        from multiprocessing import process

        original = process.BaseProcess.start
        watch = self

        def start(child: Any) -> None:
            target = getattr(child, "_target", None)  # start() deletes it (bpo-30775)
            original(child)
            if os.getpid() == watch._pid:
                watch.record(child, target)

        start.__wrapped__ = original  # type: ignore[attr-defined]
        self._original = original
        process.BaseProcess.start = start  # type: ignore[method-assign]

    def uninstall(self) -> None:
        from multiprocessing import process

        if self._original is not None and getattr(process.BaseProcess.start, "__wrapped__", None) is self._original:
            process.BaseProcess.start = self._original  # type: ignore[method-assign]
        self._original = None

    def record(self, child: Any, target: Any) -> None:
        """Count ``child``, started (its start method is known then) to run ``target``."""
        import multiprocessing

        method = getattr(type(child), "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
        module = getattr(target, "__module__", None) or ""
        self.started.append({"method": method or "fork", "dataloader": module.startswith("paddle.io")})

    @property
    def total(self) -> int:
        return len(self.started)

    @property
    def unrouted(self) -> int:
        """Children that are fresh interpreters (spawn, forkserver) and not Paddle's DataLoader workers."""
        return sum(child["method"] != "fork" and not child["dataloader"] for child in self.started)

    @property
    def forked(self) -> int:
        """Fork children other than DataLoader workers (routed: they inherit the routing)."""
        return sum(child["method"] == "fork" and not child["dataloader"] for child in self.started)


def join_new_threads(before: Set[threading.Thread]) -> None:
    """Wait for every non-daemon thread not in ``before``, as the interpreter does at exit
    (threads those threads start are waited for too)."""
    me = threading.current_thread()
    while True:
        alive = [thread for thread in threading.enumerate()
                 if thread is not me and thread not in before and not thread.daemon and thread.is_alive()]
        if not alive:
            return
        for thread in alive:
            thread.join()


class _Tracking(io.TextIOWrapper):
    """``sys.stdout`` over the same buffer, remembering the last character written."""

    last = "\n"

    def write(self, text: str) -> int:
        written = super().write(text)
        if text:
            self.last = text[-1]
        return written


class StdoutEnd:
    """The original stdout (a duplicate of fd 1 taken before the script runs) and whether the
    script's output on it ended with a newline.

    While the script runs, ``sys.stdout`` is a text stream over the interpreter's own buffer that
    notes the last character written (when ``sys.stdout`` is the interpreter's own); a regular
    file is read back instead.
    """

    def __init__(self) -> None:
        try:
            self.fd: Optional[int] = os.dup(1)
        except OSError:
            self.fd = None  # no stdout at all
        self._tracking: Optional[_Tracking] = None
        self._original: Any = None

    def track(self) -> None:
        """Put the tracking stream in place of ``sys.stdout`` (only when it is the interpreter's own)."""
        stream = sys.stdout
        if type(stream) is not io.TextIOWrapper or stream is not sys.__stdout__:
            return
        try:
            stream.flush()
            self._tracking = _Tracking(stream.buffer, encoding=stream.encoding, errors=stream.errors,
                                       line_buffering=stream.line_buffering, write_through=stream.write_through)
        except (ValueError, OSError, AttributeError):
            return
        self._original = stream
        sys.stdout = self._tracking

    def untrack(self) -> None:
        """Flush the script's streams and put the interpreter's ``sys.stdout`` back (if still ours)."""
        for stream in (sys.stdout, sys.__stdout__, self._tracking):
            try:
                if stream is not None:
                    stream.flush()
            except (ValueError, OSError, AttributeError):
                pass
        if self._tracking is None:
            return
        if sys.stdout is self._tracking:
            sys.stdout = self._original
        try:
            self._tracking.detach()  # the buffer stays open: the interpreter's stdout still writes to it
        except (ValueError, OSError):
            pass  # closed by the script

    def ends_with_newline(self) -> bool:
        if self.fd is None:
            return True
        try:
            info = os.fstat(self.fd)
            if stat.S_ISREG(info.st_mode):
                where = os.lseek(self.fd, 0, os.SEEK_CUR)
                return where == 0 or os.pread(self.fd, 1, where - 1) == b"\n"
        except OSError:
            pass
        return self._tracking is None or self._tracking.last == "\n"

    def write_line(self, text: str) -> bool:
        """Write ``text`` as a line of its own on the original stdout; False where there is none."""
        if self.fd is None:
            return False
        data = (("" if self.ends_with_newline() else "\n") + text + "\n").encode("utf-8", "replace")
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            return False
        finally:
            os.close(self.fd)
            self.fd = None
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
