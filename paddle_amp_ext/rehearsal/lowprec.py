"""Which float32 tensors of a rehearsal hold low-precision values (what AMP would keep in fp16).

A rehearsal rounds a value where AMP would make it low precision and marks the result here, so
that an op on Paddle's "follow the inputs" path (``add``, ``relu``, ``reshape``) knows it would
run in low precision too, and a white-listed op does not round an input twice. Marks are keyed
by the tensor object and die with it (a weak reference), so nothing here keeps memory alive.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Iterable, Tuple

import paddle

from .._compat.tensors import is_float32
from .rounding import round_trip

_marked: Dict[int, Tuple[weakref.ref[paddle.Tensor], str]] = {}


def _forget(key: int) -> Any:
    def forget(ref: Any) -> None:
        entry = _marked.get(key)
        if entry is not None and entry[0] is ref:
            del _marked[key]
    return forget


def mark(value: Any, dtype: str) -> Any:
    """Mark ``value`` (a tensor, or a list/tuple of them) as holding ``dtype`` values."""
    if isinstance(value, paddle.Tensor):
        key = id(value)
        _marked[key] = (weakref.ref(value, _forget(key)), dtype)
    elif isinstance(value, (list, tuple)):
        for item in value:
            mark(item, dtype)
    return value


def is_low(tensor: paddle.Tensor, dtype: str) -> bool:
    """Whether ``tensor`` was marked as holding ``dtype`` values (and is still that object)."""
    entry = _marked.get(id(tensor))
    return entry is not None and entry[1] == dtype and entry[0]() is tensor


def _float32(value: Any) -> bool:
    return isinstance(value, paddle.Tensor) and is_float32(value)


def tensors(args: Iterable[Any]) -> Iterable[paddle.Tensor]:
    """The float32 tensors among ``args``, one list/tuple level deep (``paddle.concat([a, b])``)."""
    for value in args:
        if _float32(value):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if _float32(item):
                    yield item


def all_low(args: Iterable[Any], dtype: str) -> bool:
    """True when ``args`` hold at least one float32 tensor and every one of them holds ``dtype``
    values: an op on the "follow the inputs" path then runs in low precision under AMP."""
    seen = False
    for tensor in tensors(args):
        if not is_low(tensor, dtype):
            return False
        seen = True
    return seen


def rounded(value: Any, dtype: str, in_place: bool = False) -> Any:
    """``value`` with each unmarked float32 tensor rounded through ``dtype`` (and marked);
    ``in_place`` as for :func:`.rounding.round_trip` (for an op's own outputs only)."""
    if _float32(value):
        return value if is_low(value, dtype) else mark(round_trip(value, dtype, in_place), dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(rounded(item, dtype, in_place) for item in value)
    return value


def count() -> int:
    """How many marked tensors are alive (for tests: marks must not outlive their tensors)."""
    return sum(1 for ref, _ in list(_marked.values()) if ref() is not None)
