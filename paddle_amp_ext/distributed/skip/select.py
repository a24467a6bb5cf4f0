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
    """``flag`` OR-ed over the ranks where their flags can differ: the skip decision every rank shares.

    A collective: every rank must call it at the same point of the step. It runs none in one
    process, under plain data parallel or for an auto-parallel DistTensor flag; one MAX all-reduce
    over the world under fleet's sharding, tensor and pipeline parallel and stage 2/3; one over the
    mesh under auto-dp (the decision map: :mod:`paddle_amp_ext.distributed.skip`). No host sync.

    Args:
        flag: this rank's found_inf: a 1-element bool, int or float tensor, or a Python or numpy
            number (nonzero and NaN are found).
        optimizer: the optimizer about to step (Paddle's, fleet's or auto-parallel's). None:
            always agreed over the world.
        scaler: the scaler whose found_inf this is; when its ``_unscale`` already reduced the flag
            (``fleet.distributed_scaler``, ``GroupShardedScaler``, ``dist.shard_scaler``), no
            second collective runs.

    Returns:
        A flag with the same value on every rank (a Python bool alone).

    Raises:
        TypeError, ValueError: ``flag`` is not a found_inf flag, before any collective.

    Example:
        >>> found = agree_found_inf(found_inf, optimizer)  # found_inf from check_finite_and_unscale
        >>> if not bool(found):
        ...     optimizer.step()
    """
    flag = checked_flag(flag)
    if optimizer is None:
        if is_dist(flag) and _ap.auto_dp_enabled():  # its label may be a fake Replicate: reduce the local value
            return reduce_local_max(flag, flag.process_mesh)
        return flag if agreed_by_scaler(scaler) else all_reduce_max(flag)
    return strategy_of(optimizer).agree(flag, optimizer, scaler)
