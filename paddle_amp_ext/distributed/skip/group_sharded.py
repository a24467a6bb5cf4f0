"""Stage 2/3 (``group_sharded_parallel``): the step reduces, a rank holds its slice."""

from __future__ import annotations

from typing import Any, Optional

from ..clips import GroupShardedNormClip
from ..flags import Flag, all_reduce_max
from .base import SkipStrategy, agreed_by_scaler


class GroupSharded(SkipStrategy):
    """One MAX all-reduce of the flag over the world, or none when the decision rides on the
    sharding group's norm all-reduce (:class:`~paddle_amp_ext.distributed.clips.GroupShardedNormClip`)."""

    name = "group_sharded"
    gradients = "this rank's unreduced gradient, or its slice"
    clips_in_step = True

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        return flag if agreed_by_scaler(scaler) else all_reduce_max(flag)

    def recorder(self, optimizer: Any, clip: Any) -> Any:
        return GroupShardedNormClip(None if clip is None else clip.clip_norm, self.layout.group)
