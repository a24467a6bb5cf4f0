"""Stage 2/3 (``group_sharded_parallel``): the step reduces, a rank holds its slice."""

from __future__ import annotations

from typing import Any

from ..clips import GroupShardedNormClip
from .base import ReducedInStep


class GroupSharded(ReducedInStep):
    """One MAX all-reduce of the flag over the world, or none when the decision rides on the
    sharding group's norm all-reduce (:class:`~paddle_amp_ext.distributed.clips.GroupShardedNormClip`)."""

    name = "group_sharded"
    gradients = "this rank's unreduced gradient, or its slice"

    def recorder(self, optimizer: Any, clip: Any) -> Any:
        return GroupShardedNormClip(None if clip is None else clip.clip_norm, self.layout.group)
