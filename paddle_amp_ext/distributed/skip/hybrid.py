"""Fleet's sharding, tensor and pipeline parallel (``HybridParallelOptimizer``): the step reduces."""

from __future__ import annotations

from typing import Any, Optional

from ..._compat import fleet as _fleet
from ..flags import Flag, all_reduce_max
from .base import SkipStrategy, agreed_by_scaler


class FleetHybrid(SkipStrategy):
    """Before the step a rank holds its own unreduced gradient or its shard: one MAX all-reduce of
    the flag over the world, or none when the decision rides on fleet's own clip's reduced norm."""

    name = "hybrid"
    gradients = "this rank's unreduced gradient, or its shard"
    clips_in_step = True

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        return flag if agreed_by_scaler(scaler) else all_reduce_max(flag)

    def recorder(self, optimizer: Any, clip: Any) -> Any:
        """Fleet's own ``HybridParallelClipGrad`` (its norm all-reduces), keeping the norm."""
        return _fleet.recording_hybrid_clip(clip, self.layout.group, optimizer)
