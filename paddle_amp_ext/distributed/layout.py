"""Where an optimizer's gradients are reduced: already in backward, or inside its ``step()``.

``paddle.DataParallel`` and fleet's plain data parallel all-reduce the gradients during
backward: at ``scaler.step()`` every rank holds the gradient the optimizer applies, so the
clip and its norm are computed here, locally. Fleet's sharding, tensor and pipeline parallel
(``HybridParallelOptimizer``) and stage 2/3 (``group_sharded_parallel``) reduce inside
``optimizer.step()``: before it a rank holds its own unreduced gradient (sharding, data parallel
under hybrid configs) or its shard (tensor parallel, pipeline stages, stage 3), so the clip must
run inside the step, where fleet runs its own, with the norm reduced over fleet's groups.

Auto-parallel (``dist.shard_tensor``/``shard_layer``/``parallelize``, the optimizer often wrapped
by ``dist.shard_optimizer``): the parameters and gradients are DistTensors, global views whose
reductions Paddle's SPMD rules run inside each op (a ``Partial`` gradient is reduced by the op
that needs it: the clip's norm, the optimizer's update). The clip runs here, before the step;
its norm and the found_inf flag computed from DistTensors are already global, the same on every
rank of the mesh, so no collective of ours runs on them (a ``paddle.distributed`` collective
on a DistTensor segfaults). The mesh must span every rank that steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _compat
from .._compat import fleet as _fleet

_KINDS = ("local", "hybrid", "group_sharded", "auto_parallel")


@dataclass(frozen=True)
class Layout:
    """How one optimizer's step reduces gradients.

    Attributes:
        kind: ``"local"`` (gradients already reduced, or one process), ``"hybrid"`` (fleet's
            ``HybridParallelOptimizer`` outside plain data parallel), ``"group_sharded"``
            (stage 2/3) or ``"auto_parallel"`` (DistTensor parameters).
        group: the hybrid communicate group (``"hybrid"``), the sharding group
            (``"group_sharded"``) or the first parameter's ``ProcessMesh``
            (``"auto_parallel"``); None for ``"local"``.

    Raises:
        ValueError: an unknown ``kind``.
    """

    kind: str
    group: Any = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Layout kind must be one of {_KINDS}. Received: kind={self.kind!r}")

    @property
    def clips_in_step(self) -> bool:
        """Whether the clip must run inside ``optimizer.step()``, on the reduced gradients."""
        return self.kind in ("hybrid", "group_sharded")

    @property
    def norm_is_global(self) -> bool:
        """Whether a norm (and a found_inf flag) computed from the gradients here, before the step,
        is already the same on every rank: auto-parallel's SPMD rules reduce it. (Under
        ``paddle.DataParallel`` the gradients are reduced too, but a rank's copy can still go
        non-finite after the reduction: the flag is agreed there, one all-reduce.)"""
        return self.kind == "auto_parallel"


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
    first = _compat.first_parameter(optimizer)
    if _compat.is_dist(first):
        return Layout("auto_parallel", first.process_mesh)
    return Layout("local")
