"""Where an optimizer's gradients are reduced: already in backward, or inside its ``step()``.

``paddle.DataParallel`` and fleet's plain data parallel all-reduce the gradients during
backward: at ``scaler.step()`` every rank holds the gradient the optimizer applies, so the
clip and its norm are computed here, locally. Fleet's sharding, tensor and pipeline parallel
(``HybridParallelOptimizer``) and stage 2/3 (``group_sharded_parallel``) reduce inside
``optimizer.step()``: before it a rank holds its own unreduced gradient (sharding, data parallel
under hybrid configs) or its shard (tensor parallel, pipeline stages, stage 3), so the clip must
run inside the step, where fleet runs its own, with the norm reduced over fleet's groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._compat import fleet as _fleet


@dataclass(frozen=True)
class Layout:
    """How one optimizer's step reduces gradients.

    Attributes:
        kind: ``"local"`` (gradients already reduced, or one process), ``"hybrid"`` (fleet's
            ``HybridParallelOptimizer`` outside plain data parallel) or ``"group_sharded"``
            (stage 2/3).
        group: the hybrid communicate group (``"hybrid"``) or the sharding group
            (``"group_sharded"``); None for ``"local"``.
    """

    kind: str
    group: Any = None

    @property
    def clips_in_step(self) -> bool:
        """Whether the clip must run inside ``optimizer.step()``, on the reduced gradients."""
        return self.kind != "local"


def layout_of(optimizer: Any) -> Layout:
    """The :class:`Layout` of ``optimizer`` (attribute reads only: no collective, no sync).

    Args:
        optimizer: a Paddle optimizer or one of fleet's wrappers.

    Returns:
        Where its step reduces the gradients, and over which group.
    """
    hcg = _fleet.hybrid_group(optimizer)
    if hcg is not None:
        return Layout("hybrid", hcg)
    group = _fleet.group_sharded_group(optimizer)
    if group is not None:
        return Layout("group_sharded", group)
    return Layout("local")
