"""The found_inf flag across a data-parallel group, and its one read back to the host."""

from __future__ import annotations

import numpy as np
import paddle


def host_bool(flag: paddle.Tensor) -> bool:
    """The one device-to-host read of a step (robust to numpy >= 2.4's scalar rules)."""
    return bool(np.asarray(flag.numpy()).reshape(-1)[0])


def all_reduce_max(flag: paddle.Tensor) -> paddle.Tensor:
    """``flag`` OR-ed over the default process group (MAX all-reduce); unchanged when alone.

    Plain ``paddle.DataParallel`` all-reduces gradients but not found_inf, so an inf that
    appears on one rank after the gradient all-reduce would make that rank skip and the others
    step. Reducing the flag first keeps every rank's decision identical.
    """
    if not (paddle.distributed.is_initialized() and paddle.distributed.get_world_size() > 1):
        return flag
    as_int = flag.astype("int32")
    paddle.distributed.all_reduce(as_int, op=paddle.distributed.ReduceOp.MAX)
    return as_int.astype("bool")
