"""Open record writers are flushed however the process ends: exit, an exception, SIGTERM, SIGINT.

- An exit registry holds every open writer until it is closed (a writer whose hook was
  garbage-collected without ``close()`` is still there), and one ``atexit`` function closes
  those still open. It is registered when the first writer opens, after ``import paddle``
  registered Paddle's own exit functions, so it runs before those tear down Paddle's device
  state (``atexit`` runs functions in reverse order).
- SIGTERM and SIGINT (Ctrl-C): the first writer opened in the main thread (Python lets only the
  main thread set handlers) installs a handler that flushes every open writer and then ends
  the process as the handler installed before it would have, so the exit status and messages
  are unchanged: a Python handler is called (for SIGINT by default Python's own, which raises
  KeyboardInterrupt; a script's own, such as PaddleOCR's, which SIGKILLs its process group);
  otherwise that handler is put back and the signal raised again. Paddle 2.6.2 and 3.3.1
  install a C handler for SIGTERM at ``import paddle`` (it prints "`Termination signal` is
  detected by the operating system" and dies of the signal, status 143), which
  ``signal.getsignal`` does not see (it reports SIG_DFL): it is saved and put back with libc's
  ``sigaction``, copied as opaque bytes. A signal that is ignored (SIG_IGN) is left alone.
- A handler the script installs after the hook (replacing ours) is noticed at the next logged
  step (:func:`keep_handlers`, in the main thread) and wrapped the same way, so a script's
  handler runs after the flush whichever was installed first. A handler that calls the one
  it replaced (ours) reaches the handler before it, never a loop.
- A forked child (a DataLoader worker) starts with an empty registry; the writers it inherited
  never write (the parent owns their files). A writer a ``multiprocessing`` child opens itself
  is closed when that child ends, also a fork-started one (which ends with ``os._exit``, no
  ``atexit``): through ``multiprocessing.util.Finalize``.
- :func:`exclusive` runs flushes and closes one at a time across threads. One that re-enters
  in the thread already running one (a signal handler, or a garbage-collected hook's
  finalizer, run in the middle of a flush) is run right after it, so no batch is cut in half
  and a KeyboardInterrupt comes after the flush. A signal handler waits at most
  :data:`SIGNAL_WAIT` seconds for another thread's flush (a device that never answers), then
  ends the process without it.

Python runs a signal handler when the main thread next executes Python code: a main thread
blocked inside one long C call flushes and ends when that call returns. SIGKILL, an OOM kill
and an abort in C++ (a collective's error, SIGABRT) run no Python at all: what the background
flusher (:mod:`.flusher`) wrote before is what the records keep.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._log import logger

_lock = threading.RLock()
_busy = False  # True while a thread holds _lock inside exclusive()
_queued: List[Callable[[], None]] = []
_open: Dict[int, Any] = {}  # id -> writer with flush_now() and close_now(), held until closed
_exit_registered = False
_installed = False
#: per signal, the handlers ours replaced, oldest first: (Python's view of it, its C-level sigaction or None)
_chains: Dict[int, List[Tuple[Any, Any]]] = {}
_chaining: Dict[int, int] = {}  # per signal, how far down the chain the handler now running is

#: seconds a signal handler waits for a flush another thread is in (a device that never answers)
SIGNAL_WAIT = 5.0

#: bytes copied for a C-level ``struct sigaction`` (152 on Linux x86_64 and aarch64, 16 on macOS)
_SIGACTION_BYTES = 512


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) holds no writer: its exit or SIGTERM never writes
    the parent's buffered steps a second time (each inherited writer is told, see
    ``BatchedWriter.forked``), and a lock another thread held at the fork is new."""
    global _lock, _busy
    _lock, _busy = threading.RLock(), False
    _queued.clear()
    for writer in _open.values():
        writer.forked()
    _open.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def exclusive(fn: Callable[[], None], timeout: Optional[float] = None) -> bool:
    """Run ``fn()`` while no other flush or close runs; a call that re-enters in the thread
    already inside one is queued and run when that one is done. With ``timeout``, give up
    (False) when another thread's flush holds on longer."""
    global _busy
    if not _lock.acquire(timeout=-1 if timeout is None else timeout):
        return False
    try:
        if _busy:
            _queued.append(fn)
            return True
        _busy = True
        try:
            fn()
            while _queued:
                _queued.pop(0)()
        finally:
            _busy = False
            _queued.clear()
        return True
    finally:
        _lock.release()


def register(writer: Any) -> None:
    """Hold ``writer`` until :func:`unregister`; close it at exit; flush it on SIGTERM and SIGINT."""
    global _exit_registered
    _open[id(writer)] = writer
    if not _exit_registered:
        atexit.register(close_all)
        _exit_registered = True
    _close_at_child_exit()
    _install_handlers()


_finalized_in = 0  # the pid of the multiprocessing child whose exit closes its writers


def _close_at_child_exit() -> None:
    """In a ``multiprocessing`` child, also close every writer when it ends: a fork-started child
    ends with ``os._exit`` (no ``atexit``), after ``multiprocessing.util``'s own finalizers
    (``Process._bootstrap``); the registration made in a parent is cleared in a child."""
    global _finalized_in
    if _finalized_in == os.getpid():
        return
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:  # not a multiprocessing child: atexit closes the writers
        return
    from multiprocessing import util

    util.Finalize(None, close_all, exitpriority=100)  # before the other finalizers (queues' feeder threads)
    _finalized_in = os.getpid()


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


try:  # CPython's C function: signal.getsignal wraps it to turn ints into enums (10x slower)
    from _signal import getsignal as _getsignal
except ImportError:  # pragma: no cover - another interpreter
    _getsignal = signal.getsignal
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT") if hasattr(signal, name))


def _in_main_thread() -> bool:
    return threading.get_ident() == threading.main_thread().ident


def _install_handlers() -> None:
    global _installed
    if _installed or not _in_main_thread():
        return
    _installed = True
    for signum in _SIGNALS:
        _wrap(signum, signal.getsignal(signum))


def keep_handlers() -> None:
    """Put our handler back in front of one the script installed since (main thread only; a
    ``getsignal`` per signal: called at every logged step)."""
    if not _installed:
        return
    for signum in _SIGNALS:
        current = _getsignal(signum)
        if current is not _on_signal:
            _wrap(signum, current)


def _wrap(signum: int, current: Any) -> None:
    """Install ``_on_signal`` for ``signum`` with ``current`` as the handler it chains to."""
    if current == signal.SIG_IGN or current is None:  # ignored (or set outside Python and unknown): left alone
        return
    native = None if callable(current) else _native_sigaction(signum)
    chain = _chains.setdefault(signum, [])
    known = [handler for handler, _ in chain]
    if current in known:  # a handler put back by the script: what came after it is gone
        del chain[known.index(current) + 1:]
    else:
        chain.append((current, native))
    try:
        signal.signal(signum, _on_signal)
    except (OSError, ValueError) as exc:  # pragma: no cover - an embedded interpreter without signals
        logger.info("VisualDL hooks cannot flush on signal %d here: %r", signum, exc)


def _on_signal(signum: int, frame: Any) -> None:
    depth = _chaining.get(signum, 0)
    if depth:  # called by a handler we chained to, as the handler it replaced: go on down the chain
        _call_previous(signum, frame, depth + 1)
        return
    if not exclusive(partial(_flush_and_chain, signum, frame), timeout=SIGNAL_WAIT):
        logger.warning("VisualDL hook: a flush in another thread did not finish within %g s; signal %d "
                       "handled without writing the steps since.", SIGNAL_WAIT, signum)
        _call_previous(signum, frame, 1)


def _flush_and_chain(signum: int, frame: Any) -> None:
    _each_open("flush_on_signal")
    _call_previous(signum, frame, 1)


def _call_previous(signum: int, frame: Any, level: int) -> None:
    """Run the handler ``level`` places down the chain (1: the one ours replaced last)."""
    chain = _chains.get(signum, [])
    handler, native = chain[-level] if level <= len(chain) else (signal.SIG_DFL, None)
    before = _chaining.get(signum, 0)
    _chaining[signum] = level
    try:
        if callable(handler):
            handler(signum, frame)
            return
        if native is None or not _put_back_native(signum, native):
            signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)  # ends the process, as it would have without this handler
        signal.signal(signum, _on_signal)  # still alive (a C handler that returned): flush at the next one too
    finally:
        _chaining[signum] = before
