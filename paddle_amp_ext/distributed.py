"""The found_inf flag across a data-parallel group, and its one read back to the host.

A found_inf flag is a device tensor (bool or int) or a Python number: fleet's
``MixPrecisionScaler`` stores a Python int, after reading the flag back to the host itself.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import paddle

Flag = Union[paddle.Tensor, bool, int, float]


def host_bool(flag: Flag) -> bool:
    """The one device-to-host read of a step (robust to numpy >= 2.4's scalar rules); a Python
    number is read as it is, with no sync."""
    if isinstance(flag, paddle.Tensor):
        return bool(np.asarray(flag.numpy()).reshape(-1)[0])
    return bool(flag)


def all_reduce_max(flag: Flag) -> Flag:
    """``flag`` OR-ed over the default process group (MAX all-reduce), as a bool tensor; ``flag``
    itself, unchanged, when alone.

    Plain ``paddle.DataParallel`` all-reduces gradients but not found_inf, so an inf that
    appears on one rank after the gradient all-reduce would make that rank skip and the others
    step. Reducing the flag first keeps every rank's decision identical.
    """
    if not (paddle.distributed.is_initialized() and paddle.distributed.get_world_size() > 1):
        return flag
    if isinstance(flag, paddle.Tensor):
        as_int = flag.astype("int32")
    else:
        as_int = paddle.to_tensor([int(bool(flag))], dtype="int32")
    paddle.distributed.all_reduce(as_int, op=paddle.distributed.ReduceOp.MAX)
    return as_int.astype("bool")
