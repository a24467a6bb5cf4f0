"""Data parallel (``paddle.DataParallel``, fleet's plain data parallel): the gradients are reduced
in backward, so every rank's flag is already the same, except for parameters the all-reduce
leaves alone."""

from __future__ import annotations

from typing import Any, Optional

from ..._compat import is_dist
from .. import flags
from ..flags import Flag, all_reduce_max
from ..layout import flags_agree
from .base import SkipStrategy, agreed_by_scaler


class DataParallel(SkipStrategy):
    """Several processes, gradients reduced before the step: no collective, unless a parameter is
    ``no_sync``/``is_distributed`` (then one MAX all-reduce of the flag over the world)."""

    name = "data_parallel"
    gradients = "the reduced gradient (no_sync / is_distributed ones: this rank's own)"

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        if agreed_by_scaler(scaler):
            return flag
        if not is_dist(flag) and flags._world() > 1 and flags_agree(optimizer):  # alone: no parameter scan
            return flag
        return all_reduce_max(flag)
