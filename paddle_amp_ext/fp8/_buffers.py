"""Float32 CPU tensors read and written through numpy views of their memory, and reused.

The FP8 linears (:mod:`.linear`) hand every operand to the compiled quantization kernel and
every quantized operand to Paddle's matmul. Copies (``.numpy()``, ``paddle.to_tensor``) and new
allocations cost more than the rounding on small layers: a new tensor's memory is touched for the
first time by the kernel (page faults), so a layer keeps its quantized operands' tensors
(:class:`BufferPool`) and writes the next step's into them once nothing else holds them.

Views rely on ``Tensor.data_ptr()`` (public since Paddle 2.6) and are valid only while the
tensor lives and is not written by anyone else: for operands used inside one call.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
from typing import Dict, Optional, Tuple

import numpy as np
import paddle

#: Tensors of at least this many values are read and written through views of their memory
#: (all but empty ones); the tests raise it to compare with the copying path.
VIEW_FROM = 1

Buffer = Tuple[Optional[paddle.Tensor], np.ndarray]


def new_float32(shape: Tuple[int, int]) -> Buffer:
    """A new float32 tensor and a numpy view of its memory to write it through, without the copy
    of ``paddle.to_tensor``; where the default device is not the CPU (or the tensor is empty),
    None and a numpy array the caller copies over (:func:`as_tensor`)."""
    if shape[0] * shape[1] < VIEW_FROM or paddle.device.get_device() != "cpu":
        return None, np.zeros(shape, np.float32)
    tensor = paddle.empty([shape[0], shape[1]], "float32")
    buffer = (ctypes.c_float * (shape[0] * shape[1])).from_address(tensor.data_ptr())
    return tensor, np.ctypeslib.as_array(buffer).reshape(shape)  # alive while the tensor is: the caller keeps both


def as_tensor(buffer: Buffer) -> paddle.Tensor:
    """The tensor of ``buffer``, or a copy of its array where it has none."""
    return buffer[0] if buffer[0] is not None else paddle.to_tensor(buffer[1])


def host(t: paddle.Tensor, cols: int) -> Tuple[np.ndarray, Optional[int]]:
    """``t`` as a float32 ``[-1, cols]`` numpy array and the address of its first value: a view
    of its memory where ``t`` is a contiguous float32 CPU tensor (valid only while ``t`` lives
    and is not written: for operands used inside one call), else a copy (``.numpy()``, which
    syncs) and None."""
    n = math.prod(t.shape)
    if (n >= VIEW_FROM and t.dtype == paddle.float32 and t.place.is_cpu_place() and t.is_contiguous()
            and not getattr(t, "is_dist", lambda: False)()):
        address = t.data_ptr()
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address)).reshape(-1, cols), address
    return t.reshape([-1, cols]).astype("float32").numpy(), None


def _references(pair: tuple) -> int:
    tensor = pair[0]  # as in BufferPool.take: the pair, the name ``tensor`` and the argument
    return sys.getrefcount(tensor)


#: What ``sys.getrefcount`` says of a tensor held only by its pool entry (measured, not assumed:
#: interpreters count differently).
_FREE = _references((object(), None))


class BufferPool:
    """A layer's reused tensors, one per slot (``"input"``, ``"weight"``, ...).

    :meth:`take` gives the slot's tensor again when its shape fits and no one else holds it (the
    autograd context that saved it was released after the backward; ``sys.getrefcount`` says so:
    Paddle runs a PyLayer's forward and backward without recording, so no graph node holds it
    behind Python's back), else a new one that the slot keeps. Tensors handed on to Paddle as
    results (gradients) must not come from a pool: Paddle may keep them as ``.grad``.
    """

    def __init__(self) -> None:
        self._slots: Dict[str, Buffer] = {}
        self._lock = threading.Lock()

    def take(self, slot: str, shape: Tuple[int, int]) -> Buffer:
        """A float32 ``shape`` tensor and its view (:func:`new_float32`), reused where it can be."""
        with self._lock:  # one thread at a time looks and takes: a second one sees the first's reference
            held = self._slots.get(slot)
            if held is not None and held[1].shape == shape:
                tensor = held[0]
                if sys.getrefcount(tensor) == _FREE:
                    return tensor, held[1]
            tensor, view = new_float32(shape)
            if tensor is not None:
                self._slots[slot] = (tensor, view)
            return tensor, view  # a pair of its own: whoever keeps it holds the tensor, not the slot's pair
