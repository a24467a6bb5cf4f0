"""One process: the flag is the decision, with no collective."""

from __future__ import annotations

from typing import Any, Optional

from ..flags import Flag, all_reduce_max
from .base import SkipStrategy, agreed_by_scaler


class SingleProcess(SkipStrategy):
    """One process (no default process group, or a world of one): nothing to agree."""

    name = "single"
    gradients = "the gradient the optimizer applies"

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        if agreed_by_scaler(scaler):
            return flag
        return all_reduce_max(flag)  # alone: the flag itself, no collective
