"""The package logger and warn-once helpers."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("paddle_amp_ext")

_seen: set[str] = set()
_lock = threading.Lock()


def _once(level: int, key: str, message: str, args: tuple) -> bool:
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    logger.log(level, message, *args)
    return True


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process.

    Returns True when the message was logged.
    """
    return _once(logging.WARNING, key, message, args)


def info_once(key: str, message: str, *args: object) -> bool:
    """Like :func:`warn_once` at INFO level."""
    return _once(logging.INFO, key, message, args)


def reset_once() -> None:
    """Forget which messages were shown (for tests)."""
    with _lock:
        _seen.clear()
