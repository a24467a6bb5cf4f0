"""Rehearsal state shared by the core and the edges: what fp16 emulation rehearses, and where.

Held in :class:`contextvars.ContextVar` s, so it belongs to the thread (or asyncio task) that
entered ``fp16_emulation``: a scaler in another thread does not turn on, and an fp16 and a bf16
rehearsal in two threads do not see each other's dtype. Three stacks:

- the active rehearsals: (dtype, white list, black list, level) of each ``fp16_emulation``;
- the ``auto_cast`` contexts entered inside a rehearsal: (enable requested, lists, level), whose
  lists the op-level rehearsal follows;
- float32 regions (layers kept by ``keep_fp32``), where nothing is rounded.
"""

from __future__ import annotations

import contextvars
from typing import FrozenSet, Optional, Tuple

Lists = Tuple[FrozenSet[str], FrozenSet[str], str]  # (white, black, level)

_emulation: contextvars.ContextVar[Tuple[Tuple[str, Lists], ...]] = contextvars.ContextVar(
    "paddle_amp_ext_emulation", default=())
_autocast: contextvars.ContextVar[Tuple[Tuple[bool, Lists], ...]] = contextvars.ContextVar(
    "paddle_amp_ext_autocast", default=())
_fp32: contextvars.ContextVar[int] = contextvars.ContextVar("paddle_amp_ext_fp32", default=0)


def emulated_dtype() -> Optional[str]:
    """The dtype of the innermost active ``fp16_emulation`` context of this thread, or None."""
    stack = _emulation.get()
    return stack[-1][0] if stack else None


def push_emulation(dtype: str, lists: Lists = (frozenset(), frozenset(), "O1")) -> contextvars.Token:
    """Enter a rehearsal of ``dtype`` with its own op lists; pass the token to :func:`pop_emulation`."""
    return _emulation.set(_emulation.get() + ((dtype, lists),))


def pop_emulation(token: contextvars.Token) -> None:
    _emulation.reset(token)


def push_autocast(enabled: bool, lists: Lists) -> contextvars.Token:
    """An ``auto_cast`` entered inside a rehearsal; pass the token to :func:`pop_autocast`."""
    return _autocast.set(_autocast.get() + ((enabled, lists),))


def pop_autocast(token: contextvars.Token) -> None:
    _autocast.reset(token)


def enter_fp32() -> contextvars.Token:
    """A float32 region (a kept layer's forward) begins; pass the token to :func:`exit_fp32`."""
    return _fp32.set(_fp32.get() + 1)


def exit_fp32(token: contextvars.Token) -> None:
    _fp32.reset(token)


def rehearsed_lists() -> Optional[Lists]:
    """The lists an op called now is rounded by, or None where nothing is rounded (no rehearsal,
    a float32 region, or an ``auto_cast(enable=False)`` inside the rehearsal)."""
    stack = _emulation.get()
    if not stack or _fp32.get():
        return None
    casts = _autocast.get()
    if casts:
        enabled, lists = casts[-1]
        return lists if enabled else None
    return stack[-1][1]
