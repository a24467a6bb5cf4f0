"""Rehearsal state shared by the core and the edges: what fp16 emulation rehearses, and where.

Held in :class:`contextvars.ContextVar` s, so it belongs to the thread (or asyncio task) that
entered ``fp16_emulation``: a scaler in another thread does not turn on, and an fp16 and a bf16
rehearsal in two threads do not see each other's dtype. What is held:

- the active rehearsals: dtype, :class:`Lists`, the custom lists they were given, and whether
  they round the whole thread (``rehearse``) or only a model's forward (``fp16_emulation``);
- the ``auto_cast`` contexts entered inside a rehearsal: (enable requested, lists), whose
  lists the op-level rehearsal follows;
- the rehearsed models' scopes: the code of their layers' forwards and the layers themselves;
- float32 regions (layers kept by ``keep_fp32``), where nothing is rounded;
- who wants to hear of a ``decorate(level="O2")`` made inside a rehearsal.
"""

from __future__ import annotations

import contextvars
import sys
from typing import Any, Callable, FrozenSet, NamedTuple, Optional, Tuple


class Lists(NamedTuple):
    """The op lists in force, the AMP level and ``use_promote`` (Paddle's O2 option: an op on
    neither list runs in float32 when one of its inputs is float32; always so at O1)."""

    white: FrozenSet[str]
    black: FrozenSet[str]
    level: str = "O1"
    promote: bool = True


class _Rehearsal(NamedTuple):
    dtype: str
    lists: Lists
    custom: Tuple[Any, Any]  # the custom (white, black) lists the rehearsal was given
    thread_wide: bool  # rehearse(): every op of the thread; fp16_emulation(model): its forward

_emulation: contextvars.ContextVar[Tuple[_Rehearsal, ...]] = contextvars.ContextVar(
    "paddle_amp_ext_emulation", default=())
_autocast: contextvars.ContextVar[Tuple[Tuple[bool, Lists], ...]] = contextvars.ContextVar(
    "paddle_amp_ext_autocast", default=())
_fp32: contextvars.ContextVar[int] = contextvars.ContextVar("paddle_amp_ext_fp32", default=0)
_scopes: contextvars.ContextVar[Tuple[Scope, ...]] = contextvars.ContextVar("paddle_amp_ext_scopes", default=())
_on_decorate: contextvars.ContextVar[Tuple[Callable[..., None], ...]] = contextvars.ContextVar(
    "paddle_amp_ext_on_decorate", default=())


def emulated_dtype() -> Optional[str]:
    """The dtype of the innermost active ``fp16_emulation`` context of this thread, or None."""
    stack = _emulation.get()
    return stack[-1].dtype if stack else None


def push_emulation(dtype: str, lists: Lists = Lists(frozenset(), frozenset()), custom: Tuple[Any, Any] = (None, None),
                   thread_wide: bool = True) -> contextvars.Token:
    """Enter a rehearsal of ``dtype`` with its own op lists (and the custom lists they came
    from); ``thread_wide=False``: white-listed ops are rounded only inside the forwards of
    :func:`enter_forward`. Pass the token to :func:`pop_emulation`."""
    return _emulation.set(_emulation.get() + (_Rehearsal(dtype, lists, custom, thread_wide),))


def rehearsal_custom_lists() -> Tuple[Any, Any]:
    """The custom (white, black) lists the innermost rehearsal was given."""
    stack = _emulation.get()
    return stack[-1].custom if stack else (None, None)


def rehearsal_level() -> Optional[Tuple[str, bool]]:
    """(level, promote) of the innermost rehearsal, or None outside one."""
    stack = _emulation.get()
    return (stack[-1].lists.level, stack[-1].lists.promote) if stack else None


def pop_emulation(token: contextvars.Token) -> None:
    _emulation.reset(token)


def push_autocast(enabled: bool, lists: Lists) -> contextvars.Token:
    """An ``auto_cast`` entered inside a rehearsal; pass the token to :func:`pop_autocast`."""
    return _autocast.set(_autocast.get() + ((enabled, lists),))


def pop_autocast(token: contextvars.Token) -> None:
    _autocast.reset(token)


class Scope(NamedTuple):
    """Where a rehearsed model's forward runs: frames executing one of ``codes`` (its layers'
    ``forward`` functions) whose first argument is one of ``layers`` (their ``id``s)."""

    codes: FrozenSet[Any]
    layers: FrozenSet[int]


def push_scope(scope: Scope) -> contextvars.Token:
    """Round inside ``scope`` too, until :func:`pop_scope` with the token."""
    return _scopes.set(_scopes.get() + (scope,))


def pop_scope(token: contextvars.Token) -> None:
    _scopes.reset(token)


def in_scope() -> bool:
    """Whether an op called now is in what a rehearsal rounds: the whole thread for
    ``rehearse()``, a rehearsed model's forward for ``fp16_emulation(model)``: one of its layers'
    ``forward`` is running on the caller's stack (a walk up the stack, a few frames from an op
    inside a layer; frames of other code are told apart by their code object alone)."""
    if any(r.thread_wide for r in _emulation.get()):
        return True
    scopes = _scopes.get()
    if not scopes:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        for scope in scopes:
            if code in scope.codes and code.co_argcount and \
                    id(frame.f_locals.get(code.co_varnames[0])) in scope.layers:
                return True
        frame = frame.f_back
    return False


def listen_decorate(callback: Callable[..., None]) -> contextvars.Token:
    """``callback(layers)`` for the layers each ``decorate(level="O2")`` made in this thread
    from now on marks (:func:`mark_o2`); pass the token to :func:`unlisten_decorate`."""
    return _on_decorate.set(_on_decorate.get() + (callback,))


def unlisten_decorate(token: contextvars.Token) -> None:
    _on_decorate.reset(token)


#: The attribute ``decorate(level="O2")`` sets on each layer whose parameters it would cast,
#: where AMP cannot run: (dtype, master_weight).
O2_MARK = "_paddle_amp_ext_o2"


def mark_o2(layers: Any, dtype: str, master_weight: bool) -> None:
    """Mark ``layers`` as holding ``dtype`` parameters (``decorate(level="O2")`` where AMP cannot
    run), and tell the rehearsals of this thread listening (:func:`listen_decorate`)."""
    layers = list(layers)
    for layer in layers:
        layer.__dict__[O2_MARK] = (dtype, bool(master_weight))
    for callback in _on_decorate.get():
        callback(layers)


def o2_dtype(layer: Any) -> Optional[Tuple[str, bool]]:
    """(dtype, master_weight) of a layer ``decorate(level="O2")`` marked, else None."""
    return layer.__dict__.get(O2_MARK)


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
    return stack[-1].lists
