"""What ``python -m paddle_amp_ext.run`` watches around the script: children, threads; and the original stdout.

- :class:`ChildWatch`: the ``multiprocessing`` processes the script starts, by start method. A
  fork child inherits the routing; a spawn or forkserver child is a fresh interpreter, unrouted.
  Paddle's own ``DataLoader`` workers are told apart (they build no scaler).
- :func:`join_new_threads`: waits for the script's non-daemon threads, as the interpreter does
  before it exits, so a training thread that outlives the script's main body stays routed.
- :class:`StdoutEnd`: the original stdout (taken before the script ran), where ``--json`` puts
  the summary on a line of its own.

Relies on CPython's ``multiprocessing.process.BaseProcess`` (its ``start()``, the class attribute
``_start_method`` of the context's Process classes and the ``_target`` a Process keeps;
3.8-3.13).
"""

from __future__ import annotations

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


class StdoutEnd:
    """The original stdout (a duplicate of fd 1 taken before the script runs), for the ``--json``
    summary on a line of its own after whatever the script wrote.

    Nothing of the script's is watched: it may rebind or close ``sys.stdout``, write to fd 1
    itself, fork. On a regular file the byte before the summary is read back; anywhere else (a
    pipe, a terminal) the summary starts a new line, so it is the last line whatever came before
    (after an empty line where the script's output ended with a newline).
    """

    def __init__(self) -> None:
        try:
            self.fd: Optional[int] = os.dup(1)
        except OSError:
            self.fd = None  # no stdout at all

    @staticmethod
    def _ends_with_newline(fd: int) -> bool:
        """Whether ``fd`` is a regular file whose byte before its offset is a newline (or that is
        at its start), read through a read-only open of it (fd 1 is mostly write-only); False
        where that cannot be known."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            where = os.lseek(fd, 0, os.SEEK_CUR)
            if where == 0:
                return True
            reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # Linux; elsewhere: OSError
            try:
                return os.pread(reader, 1, where - 1) == b"\n"
            finally:
                os.close(reader)
        except OSError:
            return False

    def write_line(self, text: str) -> bool:
        """Flush the script's streams, then write ``text`` as a line of its own on the original
        stdout; False where there is none."""
        if self.fd is None:
            return False
        for stream in (sys.stdout, sys.__stdout__):  # what the script left buffered goes first
            try:
                stream.flush()
            except (ValueError, OSError, AttributeError):
                pass  # closed, or not a stream
        data = (("" if self._ends_with_newline(self.fd) else "\n") + text + "\n").encode("utf-8", "replace")
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            return False
        finally:
            self.close()
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
