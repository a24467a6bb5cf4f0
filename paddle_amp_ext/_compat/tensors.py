"""Two things the rehearsal asks of nearly every tensor it sees, asked cheaply: is it float32, and
a gradient hook on it.

Relies on (paddlepaddle 2.6.2 and 3.3.1, checked on both, CPU):

- ``Tensor.dtype`` being a pybind11 enum member with an integer ``value`` (2.6.2:
  ``VarDesc.VarType``; 3.3.1: ``DataType``). Comparing two members with ``==`` goes through
  pybind11's dispatch (1.7 us on 3.3.1, 2.4 us on 2.6.2); 3.3.1 returns the same member object
  each time (an identity test, 0.2 us), 2.6.2 a new one (its type and ``value`` compared, 0.9 us).
- ``Tensor._register_grad_hook(hook)``: what the public ``Tensor.register_hook`` calls after
  refusing a tensor that stops gradients, without the ``dygraph_only`` decorator's argument
  binding (on 2.6.2 an ``inspect`` bind per call).
"""

from __future__ import annotations

from typing import Any, Callable

import paddle

_FLOAT32 = paddle.float32
_FLOAT32_VALUE = getattr(_FLOAT32, "value", None)  # a dtype without one: compared with ==
_DTYPE = type(_FLOAT32)


def is_float32(tensor: Any) -> bool:
    """Whether ``tensor`` (a ``paddle.Tensor``) holds float32 values."""
    dtype = tensor.dtype
    if dtype is _FLOAT32:
        return True
    if _FLOAT32_VALUE is None:
        return bool(dtype == _FLOAT32)
    return type(dtype) is _DTYPE and dtype.value == _FLOAT32_VALUE


def add_grad_hook(tensor: paddle.Tensor, hook: Callable[[paddle.Tensor], Any]) -> None:
    """``tensor.register_hook(hook)`` for a dygraph tensor that does not stop gradients (the
    caller knows), without a handle to remove it: the hook lives as long as the tensor."""
    tensor._register_grad_hook(hook)
