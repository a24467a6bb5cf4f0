"""Auto-parallel (DistTensor parameters): Paddle's SPMD rules reduce every norm and flag."""

from __future__ import annotations

from typing import Any, Optional

from ..._compat import is_dist, replicated
from ..flags import Flag
from .base import SkipStrategy, agreed_by_scaler


class AutoParallel(SkipStrategy):
    """A flag computed from DistTensor gradients is already global: no collective of ours (a
    ``paddle.distributed`` collective on a DistTensor segfaults); a pending ``Partial`` reduction
    is Paddle's reshard, entered by every rank."""

    name = "auto_parallel"
    gradients = "a DistTensor whose placements are true (Shard, Replicate, Partial)"
    norm_is_global = True
    own_clip_is_global = True

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        if agreed_by_scaler(scaler) or not is_dist(flag):
            return flag
        return replicated(flag)
