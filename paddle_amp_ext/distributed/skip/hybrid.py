"""Fleet's sharding, tensor and pipeline parallel (``HybridParallelOptimizer``): the step reduces."""

from __future__ import annotations

from typing import Any

from ..._compat import fleet as _fleet
from .base import ReducedInStep


class FleetHybrid(ReducedInStep):
    """Before the step a rank holds its own unreduced gradient or its shard: one MAX all-reduce of
    the flag over the world, or none when the decision rides on fleet's own clip's reduced norm."""

    name = "hybrid"
    gradients = "this rank's unreduced gradient, or its shard"

    def recorder(self, optimizer: Any, clip: Any) -> Any:
        """Fleet's own ``HybridParallelClipGrad`` (its norm all-reduces), keeping the norm."""
        return _fleet.recording_hybrid_clip(clip, self.layout.group, optimizer)
