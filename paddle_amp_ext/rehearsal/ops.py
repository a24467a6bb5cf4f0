"""Op-level rehearsal: functional ops AMP runs in low precision, rounded wherever they are called.

The layer path of :mod:`.emulation` rounds what leaf layers take and give. Ops called outside a
rounded leaf layer (attention's ``paddle.matmul(q, k, transpose_y=True)``, ``paddle.einsum``,
``x @ w``, ``F.linear`` in a hand-written layer) are rounded here instead: while any
``fp16_emulation`` is active in the process, the Python entry points in :data:`OP_PATHS` are
wrapped; in a thread that rehearses, a wrapped op whose type the effective lists send to low
precision takes rounded float32 inputs and gives a rounded output (backward rounded the same
way), as fp16 AMP computes it. The effective lists are those of the innermost ``auto_cast``
with custom lists entered inside the rehearsal, else the rehearsal's own; an
``auto_cast(enable=False)`` inside it, or a ``keep_fp32`` layer, turns rounding off there. Code
being converted by ``paddle.jit.to_static`` is not rounded.

Entry points are public Python attributes, looked up at call time by Paddle's own code
(``nn.MultiHeadAttention`` calls ``paddle.matmul``, ``nn.Linear`` calls ``F.linear``), checked
on Paddle 2.6.2 and 3.3.1. Ops reached only from C++ (``paddle._C_ops``) are not wrapped.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Tuple

import paddle

from .. import _state
from .rounding import round_trip

#: (owner, attribute, op types AMP looks the call up as).
OP_PATHS: Tuple[Tuple[Any, str, Tuple[str, ...]], ...] = (
    (paddle, "matmul", ("matmul_v2",)),
    (paddle, "mm", ("matmul_v2",)),
    (paddle, "einsum", ("einsum",)),
    (paddle.Tensor, "matmul", ("matmul_v2",)),
    (paddle.Tensor, "__matmul__", ("matmul_v2",)),
    (paddle.Tensor, "__rmatmul__", ("matmul_v2",)),
    (paddle.Tensor, "mm", ("matmul_v2",)),
    (paddle.nn.functional, "linear", ("matmul_v2", "linear_v2")),
)

_lock = threading.Lock()
_users = 0
_saved: List[Tuple[Any, str, Any]] = []
_observers: List[Callable[[str, Any], None]] = []


def _round(value: Any, dtype: str) -> Any:
    if isinstance(value, paddle.Tensor) and value.dtype == paddle.float32:
        return round_trip(value, dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_round(v, dtype) for v in value)
    return value


def runs_low(op_types: Tuple[str, ...], white: frozenset, black: frozenset, level: str) -> bool:
    """Whether AMP runs an op looked up as ``op_types`` in low precision under these lists."""
    if any(op in black for op in op_types):
        return False
    return level == "O2" or any(op in white for op in op_types)


def _wrap(original: Callable, op_types: Tuple[str, ...]) -> Callable:
    @functools.wraps(original)
    def op(*args: Any, **kwargs: Any) -> Any:
        lists = _state.rehearsed_lists()
        if lists is None or not runs_low(op_types, *lists) or not paddle.in_dynamic_mode():
            out = original(*args, **kwargs)
        else:
            dtype = _state.emulated_dtype()
            args = _round(args, dtype)
            kwargs = {k: _round(v, dtype) for k, v in kwargs.items()}
            out = _round(original(*args, **kwargs), dtype)
        for observe in _observers:
            observe(op_types[0], out)
        return out

    op.__paddle_amp_ext_original__ = original  # type: ignore[attr-defined]
    return op


def acquire() -> None:
    """Wrap the entry points (the first rehearsal in the process does; later ones count)."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        for owner, name, op_types in OP_PATHS:
            original = getattr(owner, name, None)
            if original is None:
                continue
            _saved.append((owner, name, original))
            setattr(owner, name, _wrap(original, op_types))


def release() -> None:
    """Undo :func:`acquire` (the last rehearsal to end restores Paddle's functions)."""
    global _users
    with _lock:
        _users -= 1
        if _users > 0:
            return
        while _saved:
            owner, name, original = _saved.pop()
            setattr(owner, name, original)


class observe:  # noqa: N801 - used as a context manager, like contextlib helpers
    """Call ``callback(op_type, output)`` after every wrapped op while the block runs.

    The doctor uses it to watch functional ops; the entry points must be wrapped (inside
    ``fp16_emulation`` or :func:`acquire`).
    """

    def __init__(self, callback: Callable[[str, Any], None]) -> None:
        self.callback = callback

    def __enter__(self) -> observe:
        _observers.append(self.callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        _observers.remove(self.callback)


def wrapped_paths() -> Dict[str, bool]:
    """Which entry points are wrapped now (for tests and diagnostics)."""
    return {f"{getattr(owner, '__name__', owner)}.{name}": hasattr(getattr(owner, name, None),
                                                                     "__paddle_amp_ext_original__")
            for owner, name, _ in OP_PATHS}
