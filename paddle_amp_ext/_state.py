"""Rehearsal state shared by the core and the edges: the dtype fp16 emulation rehearses, if any.

Held in a :class:`contextvars.ContextVar`, so it belongs to the thread (or asyncio task) that
entered ``fp16_emulation``: a scaler in another thread does not turn on, and an fp16 and a bf16
rehearsal in two threads do not see each other's dtype.
"""

from __future__ import annotations

import contextvars
from typing import Optional, Tuple

_emulation: contextvars.ContextVar[Tuple[str, ...]] = contextvars.ContextVar("paddle_amp_ext_emulation", default=())


def emulated_dtype() -> Optional[str]:
    """The dtype of the innermost active ``fp16_emulation`` context of this thread, or None."""
    stack = _emulation.get()
    return stack[-1] if stack else None


def push_emulation(dtype: str) -> contextvars.Token:
    """Enter a rehearsal of ``dtype``; pass the token to :func:`pop_emulation`."""
    return _emulation.set(_emulation.get() + (dtype,))


def pop_emulation(token: contextvars.Token) -> None:
    _emulation.reset(token)
