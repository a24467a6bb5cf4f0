"""Choosing the skip strategy of an optimizer, and the public agreement built on it."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

from ..._compat import autoparallel as _ap
from ..._compat import is_dist
from .. import flags
from ..flags import Flag, all_reduce_max, checked_flag
from ..layout import layout_of
from .auto_dp import AutoDataParallel, reduce_local_max
from .auto_parallel import AutoParallel
from .base import SkipStrategy, agreed_by_scaler
from .data_parallel import DataParallel
from .group_sharded import GroupSharded
from .hybrid import FleetHybrid
from .single import SingleProcess

#: layout kind -> strategy class; ``"local"`` is split by the world size
STRATEGIES: Dict[str, Type[SkipStrategy]] = {
    cls.name: cls for cls in (SingleProcess, DataParallel, FleetHybrid, GroupSharded, AutoParallel, AutoDataParallel)
}


def strategy_of(optimizer: Any) -> SkipStrategy:
    """The :class:`SkipStrategy` of ``optimizer``'s layout (attribute reads only: no collective,
    no sync).

    Args:
        optimizer: a Paddle optimizer or one of fleet's or auto-parallel's wrappers (anything
            else is taken for one process's, or data parallel's with several processes).

    Returns:
        A new strategy object; a caller that steps the optimizer often keeps it (the scaler
        keeps one per optimizer).
    """
    layout = layout_of(optimizer)
    kind = layout.kind
    if kind == "local":
        kind = "data_parallel" if flags._world() > 1 else "single"
    return STRATEGIES[kind](layout)


def agree_found_inf(flag: Flag, optimizer: Any = None, *, scaler: Optional[Any] = None) -> Flag:
    """The skip decision every rank shares: ``flag`` OR-ed over the ranks where their flags can
    differ, before anyone steps (the optimizer's :class:`SkipStrategy` decides how).

    Every rank must call it at the same point of the step. The collective, per layout (the
    decision map of :mod:`paddle_amp_ext.distributed.skip`): none in a single process, nor where
    ``optimizer``'s gradients were reduced before the step (plain data parallel:
    :func:`~paddle_amp_ext.distributed.layout.flags_agree`), nor for a DistTensor flag under
    auto-parallel (already global); one MAX all-reduce of one int32 over the world under fleet's
    sharding, tensor and pipeline parallel and stage 2/3 (the group Paddle's own
    ``HybridParallelGradScaler``, ``fleet.distributed_scaler`` and ``GroupShardedScaler`` reduce
    found_inf over: it spans every group ``optimizer.step()`` enters); under auto-dp one all-reduce
    of one bool over the mesh (each rank's gradient is its own addend, whatever its label).

    Args:
        flag: this rank's flag, True when a gradient is inf/nan: a 1-element bool, int or float device
            tensor, or a Python or numpy number (:func:`~paddle_amp_ext.distributed.flags.checked_flag`;
            nonzero and NaN are found).
        optimizer: the optimizer about to step (any of Paddle's or fleet's). None: always agreed
            (one all-reduce when distributed; a DistTensor flag's pending reduction done, and
            under auto-dp its local value reduced over its mesh, whatever its label).
        scaler: a scaler whose found_inf this is; when fleet replaced its ``_unscale`` by one
            that reduces found_inf itself (``fleet.distributed_scaler`` outside plain data
            parallel, ``GroupShardedScaler``, ``dist.shard_scaler``), the flag is already agreed
            and no second collective runs (except under auto-dp, whose flag only claims to be).

    Returns:
        A flag with the same value on every rank (a Python bool alone).

    Raises:
        TypeError, ValueError: ``flag`` is not a found_inf flag (a wrong type, or a tensor of
            other than one element), before any collective.
    """
    flag = checked_flag(flag)
    if optimizer is None:
        if is_dist(flag) and _ap.auto_dp_enabled():  # its label may be a fake Replicate: reduce the local value
            return reduce_local_max(flag, flag.process_mesh)
        return flag if agreed_by_scaler(scaler) else all_reduce_max(flag)
    return strategy_of(optimizer).agree(flag, optimizer, scaler)
