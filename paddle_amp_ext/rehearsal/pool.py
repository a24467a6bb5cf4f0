"""Buffers for the rehearsal's rounded copies, used again once nothing reads them.

A rounded copy written into a buffer that was in use a moment ago (still in the CPU's cache)
costs about half of one written into a fresh buffer: 55 against 25 us for a 128x512 gradient,
113 against 60 us for a 512x512 weight (Intel Xeon, Paddle 3.3.1). A :class:`Lease` takes
buffers by shape and hands them all back at once, when the autograd node that reads them is gone
(:mod:`.fused` keeps a lease on the node, and a lease nothing holds is released) or when a
backward pass is done with them. Free buffers are kept for every thread alike (taking one is a
single atomic ``list.pop``), at most :data:`MAX_BYTES` of them, and dropped when the last
rehearsal ends (:func:`clear`).
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import paddle

from .._compat import kernels

#: The most bytes of free buffers kept; a buffer handed back beyond it is left to Paddle.
MAX_BYTES = 128 << 20

_free: Dict[Tuple[int, ...], List[paddle.Tensor]] = {}
_kept = [0]  # bytes in ``_free``
_generation = [0]  # bumped by clear(): leases from before it hand nothing back


class Lease:
    """Buffers taken from the pool, handed back together by :meth:`release`."""

    __slots__ = ("buffers", "generation")

    def __init__(self) -> None:
        self.buffers: List[paddle.Tensor] = []
        self.generation = _generation[0]

    def __del__(self) -> None:  # nothing holds the lease (the autograd node it was tied to is gone)
        if self.buffers:
            try:
                self.release()
            except (TypeError, AttributeError):  # at interpreter exit, this module's globals are gone
                pass

    def take(self, like: paddle.Tensor) -> paddle.Tensor:
        """A contiguous float32 buffer shaped like ``like`` (a CPU tensor), contents undefined."""
        shape = tuple(like.shape)
        try:
            buffer = _free[shape].pop()
            _kept[0] -= 4 * math.prod(shape)
        except (KeyError, IndexError):
            buffer = kernels.empty_float32(like)
        self.buffers.append(buffer)
        return buffer

    def release(self) -> None:
        """Hand every buffer back: nothing reads them any more (a second call does nothing)."""
        buffers, self.buffers = self.buffers, []
        if self.generation != _generation[0]:
            return
        for buffer in buffers:
            size = 4 * math.prod(buffer.shape)
            if _kept[0] + size <= MAX_BYTES:
                _kept[0] += size
                _free.setdefault(tuple(buffer.shape), []).append(buffer)


def clear() -> None:
    """Drop every free buffer (the last rehearsal ended); leased ones go when released."""
    _generation[0] += 1
    _free.clear()
    _kept[0] = 0


def kept_bytes() -> int:
    """How many bytes of free buffers the pool holds now (for tests)."""
    return _kept[0]
