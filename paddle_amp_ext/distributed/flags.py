"""The found_inf flag across the ranks, and its one read back to the host.

A found_inf flag is a device tensor (bool or int) or a Python number: fleet's
``MixPrecisionScaler`` stores a Python int, after reading the flag back to the host itself.
:func:`checked_flag` says what a flag may be, for :func:`host_bool` and the skip strategies'
agreement (:func:`paddle_amp_ext.distributed.skip.agree_found_inf`):
a bool, int or float (Python or numpy) or a paddle.Tensor of one element (bool, int or float),
true when it is not 0, so a NaN flag (a non-finite value) and 0.5 count as found.
Under auto-parallel it is a DistTensor (computed from DistTensor gradients, or
``dist.shard_scaler``'s found_inf): Paddle's SPMD rules already reduced it over the mesh, so it
is global and no collective of ours runs on it (a ``paddle.distributed`` collective on a
DistTensor segfaults); a pending ``Partial`` reduction is done by Paddle's reshard, on every rank.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Union

import numpy as np
import paddle

from .. import _compat

Flag = Union[paddle.Tensor, bool, int, float]


_FLAG_FIX = ("pass the step's found_inf: a bool, a number, or a 1-element paddle.Tensor such as "
             "paddle.logical_not(paddle.isfinite(norm))")


def checked_flag(flag: Any) -> Flag:
    """``flag`` as a found_inf flag: an int or bool as given, a float as a bool (nonzero), a tensor
    as a bool tensor of its one element.

    Nonzero is found, NaN included (NaN != 0). Host metadata only (type, dtype, shape): no sync,
    no collective.

    Raises:
        TypeError: not a bool, int, float (Python or numpy) or paddle.Tensor, or a tensor that
            is not bool, int or float.
        ValueError: a tensor that does not hold exactly one element (a per-tensor flag of
            several must be reduced first: ``paddle.any(flags)``).
    """
    if isinstance(flag, paddle.Tensor):
        if flag.dtype != paddle.bool and not (flag.is_floating_point() or _is_integer(flag)):
            raise TypeError(f"A found_inf flag tensor must be bool, int or float. Received a tensor of dtype "
                            f"{flag.dtype}: {_FLAG_FIX}.")
        elements = math.prod(flag.shape)
        if elements != 1:
            raise ValueError(f"A found_inf flag must hold exactly one element. Received a tensor of shape "
                             f"{list(flag.shape)} ({elements} elements): reduce it first (paddle.any(flags)) or "
                             f"{_FLAG_FIX}.")
        return flag if flag.dtype == paddle.bool else flag != 0
    if isinstance(flag, (bool, np.bool_)):
        return bool(flag)
    if isinstance(flag, numbers.Integral):  # as stored (fleet's MixPrecisionScaler keeps an int)
        return flag
    if isinstance(flag, numbers.Real):  # float, numpy floats: NaN != 0 counts as found
        return bool(flag != 0)
    raise TypeError(f"A found_inf flag must be a bool, int, float or a 1-element paddle.Tensor. Received: "
                    f"{flag!r} (of type {type(flag).__name__}): {_FLAG_FIX}.")


def _is_integer(tensor: paddle.Tensor) -> bool:
    return tensor.dtype in (paddle.int8, paddle.int16, paddle.int32, paddle.int64, paddle.uint8)


def host_bool(flag: Flag) -> bool:
    """The one device-to-host read of a step (robust to numpy >= 2.4's scalar rules).

    Args:
        flag: a 1-element device tensor, or a Python number (read as it is, with no sync). A
            DistTensor is read from its local value (a ``Partial`` one reduced first by Paddle's
            reshard, which every rank enters at this read).

    Returns:
        The flag as a Python bool (a tensor costs one device-to-host sync).

    Raises:
        TypeError, ValueError: not a found_inf flag (:func:`checked_flag`).
    """
    flag = checked_flag(flag)
    if isinstance(flag, paddle.Tensor):
        flag = _compat.local_value(_compat.replicated(flag))
        return bool(np.asarray(flag.numpy()).reshape(-1)[0])
    return bool(flag)


def _world() -> int:
    if not paddle.distributed.is_initialized():
        return 1
    return paddle.distributed.get_world_size()


def all_reduce_max(flag: Flag) -> Flag:
    """``flag`` OR-ed over every rank (one MAX all-reduce of an int32).

    Every rank must call it at the same point: it is a collective over the world when more than
    one process runs, nothing in a single process.

    Args:
        flag: this rank's flag, a bool device tensor or a Python bool/int.

    A DistTensor flag is already global (Paddle's SPMD rules reduced it): returned with no
    collective of ours (a ``paddle.distributed`` collective on a DistTensor segfaults), its
    ``Partial`` reduction done.

    Returns:
        The agreed flag as a bool tensor; ``flag`` itself, unchanged, when alone.
    """
    if _compat.is_dist(flag):
        return _compat.replicated(flag)
    if _world() <= 1:
        return flag
    if isinstance(flag, paddle.Tensor):
        as_int = flag.astype("int32")
    else:
        as_int = paddle.to_tensor([int(bool(flag))], dtype="int32")
    paddle.distributed.all_reduce(as_int, op=paddle.distributed.ReduceOp.MAX)
    return as_int.astype("bool")
