"""The found_inf flag across the ranks, and its one read back to the host.

A found_inf flag is a device tensor (bool or int) or a Python number: fleet's
``MixPrecisionScaler`` stores a Python int, after reading the flag back to the host itself.
Under auto-parallel it is a DistTensor (computed from DistTensor gradients, or
``dist.shard_scaler``'s found_inf): Paddle's SPMD rules already reduced it over the mesh, so it
is global and no collective of ours runs on it (a ``paddle.distributed`` collective on a
DistTensor segfaults); a pending ``Partial`` reduction is done by Paddle's reshard, on every rank.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import paddle

from .. import _compat
from .._compat import fleet as _fleet

Flag = Union[paddle.Tensor, bool, int, float]


def host_bool(flag: Flag) -> bool:
    """The one device-to-host read of a step (robust to numpy >= 2.4's scalar rules); a Python
    number is read as it is, with no sync. A DistTensor is read from its local value (a
    ``Partial`` one reduced first by Paddle's reshard, which every rank enters at this read)."""
    if isinstance(flag, paddle.Tensor):
        flag = _compat.local_value(_compat.replicated(flag))
        return bool(np.asarray(flag.numpy()).reshape(-1)[0])
    return bool(flag)


def _world() -> int:
    if not paddle.distributed.is_initialized():
        return 1
    return paddle.distributed.get_world_size()


def all_reduce_max(flag: Flag) -> Flag:
    """``flag`` OR-ed over every rank (one MAX all-reduce of an int32), as a bool tensor;
    ``flag`` itself, unchanged, when alone. A DistTensor flag is already global (Paddle's SPMD
    rules reduced it): returned with no collective of ours, its ``Partial`` reduction done."""
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


def agree_found_inf(flag: Flag, optimizer: Any = None, *, scaler: Optional[Any] = None) -> Flag:
    """The skip decision every rank shares: ``flag`` OR-ed over the world, before anyone steps.

    Every rank must call it at the same point of the step: it is one collective (a MAX
    all-reduce of one int32) when more than one process runs, none in a single process. The
    group is the whole world, the group Paddle's own ``HybridParallelGradScaler``,
    ``fleet.distributed_scaler`` and ``GroupShardedScaler`` reduce found_inf over: it spans every
    group whose collectives ``optimizer.step()`` enters (data parallel, sharding, tensor and
    pipeline parallel), so no rank can skip while another enters a reduce and waits for it.

    Args:
        flag: this rank's bool flag (a 1-element device tensor), True when a gradient is inf/nan.
        optimizer: the optimizer about to step (any of Paddle's or fleet's); kept so a caller
            states which step the decision is for. Every fleet wrapper steps collectively over
            the world, so it does not change the group today.
        scaler: a scaler whose found_inf this is; when fleet replaced its ``_unscale`` by one
            that reduces found_inf itself (``fleet.distributed_scaler`` outside plain data
            parallel, ``GroupShardedScaler``), the flag is already agreed and no second
            collective runs.

    Returns:
        A bool tensor with the same value on every rank.
    """
    del optimizer  # see Args: the world is the group for every optimizer
    if scaler is not None and _fleet.unscale_reduces_found_inf(scaler):
        return flag
    return all_reduce_max(flag)
