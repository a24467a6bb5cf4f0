"""Open record writers are flushed however the process ends: exit, an exception, SIGTERM.

- An exit registry holds every open writer until it is closed (a writer whose hook was
  garbage-collected without ``close()`` is still there), and one ``atexit`` function closes
  those still open. It is registered when the first writer opens, after ``import paddle``
  registered Paddle's own exit functions, so it runs before those tear down Paddle's device
  state (``atexit`` runs functions in reverse order).
- The first writer opened in the main thread (Python lets only the main thread set handlers)
  installs a SIGTERM handler that flushes every open writer and then ends the process as the
  handler installed before it would have, so the exit status and messages are unchanged: a
  Python handler is called; otherwise that handler is put back and the signal raised again.
  Paddle 2.6.2 and 3.3.1 install a C handler at ``import paddle`` (it prints "`Termination
  signal` is detected by the operating system" and dies of the signal, status 143), which
  ``signal.getsignal`` does not see (it reports SIG_DFL): it is saved and put back with libc's
  ``sigaction``, copied as opaque bytes. A SIGTERM that is ignored is left alone.
- :func:`exclusive` runs flushes and closes one at a time across threads. One that re-enters
  in the thread already running one (the SIGTERM handler, or a garbage-collected hook's
  finalizer, run in the middle of a flush) is run right after it, so no batch is cut in half.

Python runs a signal handler when the main thread next executes Python code: a main thread
blocked inside one long C call flushes and ends when that call returns.
"""

from __future__ import annotations

import atexit
import ctypes
import signal
import threading
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._log import logger

_lock = threading.RLock()
_busy = False  # True while a thread holds _lock inside exclusive()
_queued: List[Callable[[], None]] = []
_open: Dict[int, Any] = {}  # id -> writer with flush_now() and close_now(), held until closed
_exit_registered = False
_previous: Optional[Tuple[Any, Any]] = None  # (Python's view of the old handler, the C-level sigaction or None)

#: bytes copied for a C-level ``struct sigaction`` (152 on Linux x86_64 and aarch64, 16 on macOS)
_SIGACTION_BYTES = 512


def exclusive(fn: Callable[[], None]) -> None:
    """Run ``fn()`` while no other flush or close runs; a call that re-enters in the thread
    already inside one is queued and run when that one is done."""
    global _busy
    with _lock:
        if _busy:
            _queued.append(fn)
            return
        _busy = True
        try:
            fn()
            while _queued:
                _queued.pop(0)()
        finally:
            _busy = False
            _queued.clear()


def register(writer: Any) -> None:
    """Hold ``writer`` until :func:`unregister`; close it at exit; flush it on SIGTERM."""
    global _exit_registered
    _open[id(writer)] = writer
    if not _exit_registered:
        atexit.register(close_all)
        _exit_registered = True
    _install_sigterm()


def unregister(writer: Any) -> None:
    _open.pop(id(writer), None)


def _each_open(method: str) -> None:
    for writer in list(_open.values()):
        try:
            getattr(writer, method)()
        except Exception as exc:  # one writer's failure never stops the others, nor the exit
            logger.warning("VisualDL hook could not write %s: %r", getattr(writer, "path", writer), exc)


def close_all() -> None:
    """Flush and close every open writer (at interpreter exit)."""
    exclusive(partial(_each_open, "close_now"))


def _native_sigaction(signum: int) -> Optional[ctypes.Array]:
    """The C-level disposition of ``signum`` as opaque bytes, or None (SIG_DFL, or no libc)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        action = ctypes.create_string_buffer(_SIGACTION_BYTES)
        if libc.sigaction(signum, None, action) != 0:
            return None
    except (OSError, AttributeError):
        return None
    handler = ctypes.c_void_p.from_buffer(action).value  # the handler is the first field on Linux and macOS
    return action if handler not in (None, 0) else None


def _put_back_native(signum: int, action: ctypes.Array) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).sigaction(signum, action, None) == 0
    except (OSError, AttributeError):
        return False


def _install_sigterm() -> None:
    global _previous
    sigterm = getattr(signal, "SIGTERM", None)
    if _previous is not None or sigterm is None or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(sigterm)
    if current == signal.SIG_IGN:
        return
    native = None if callable(current) else _native_sigaction(sigterm)
    try:
        signal.signal(sigterm, _on_sigterm)
    except (OSError, ValueError) as exc:  # pragma: no cover - an embedded interpreter without signals
        logger.info("VisualDL hooks cannot flush on SIGTERM here: %r", exc)
        return
    _previous = (current, native)


def _on_sigterm(signum: int, frame: Any) -> None:
    exclusive(partial(_flush_and_chain, signum, frame))


def _flush_and_chain(signum: int, frame: Any) -> None:
    _each_open("flush_now")
    handler, native = _previous if _previous is not None else (signal.SIG_DFL, None)
    if callable(handler):
        handler(signum, frame)
        return
    if native is None or not _put_back_native(signum, native):
        signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)  # ends the process, as it would have without this handler
    signal.signal(signum, _on_sigterm)  # still alive (a C handler that returned): flush at the next one too
