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

Auto-dp (``dist.enable_auto_dp()``, which PaddleFormers' auto-parallel Trainer turns on): each
rank's gradient is its own unreduced addend, labelled ``Replicate`` until the optimizer's step
relabels it ``Partial`` and reduces it. Before the step nothing computed from it is global, so
the clip runs inside the step (as under fleet) and a found_inf flag is reduced once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _compat
from .._compat import autoparallel as _autoparallel
from .._compat import fleet as _fleet

_KINDS = ("local", "hybrid", "group_sharded", "auto_parallel", "auto_dp")


@dataclass(frozen=True)
class Layout:
    """How one optimizer's step reduces gradients.

    Attributes:
        kind: ``"local"`` (gradients already reduced, or one process), ``"hybrid"`` (fleet's
            ``HybridParallelOptimizer`` outside plain data parallel), ``"group_sharded"``
            (stage 2/3), ``"auto_parallel"`` (DistTensor parameters) or ``"auto_dp"``
            (``dist.enable_auto_dp()`` with several processes: each rank's gradient is its
            own addend until the optimizer's step reduces it).
        group: the hybrid communicate group (``"hybrid"``), the sharding group
            (``"group_sharded"``) or the first parameter's ``ProcessMesh``
            (``"auto_parallel"``; ``"auto_dp"``, None for dense parameters); None for ``"local"``.

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
        return self.kind in ("hybrid", "group_sharded", "auto_dp")

    @property
    def norm_is_global(self) -> bool:
        """Whether a norm (and a found_inf flag) computed from the gradients here, before the step,
        is already the same on every rank: auto-parallel's SPMD rules reduce it. (Under
        ``paddle.DataParallel`` the gradients are reduced too, except those of parameters it
        leaves alone: see :func:`flags_agree`.)"""
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
    dist = _compat.is_dist(first)
    if _autoparallel.auto_dp_enabled():  # also dense parameters: the step reduces their gradients
        return Layout("auto_dp", first.process_mesh if dist else None)
    if dist:
        return Layout("auto_parallel", first.process_mesh)
    return Layout("local")


def flags_agree(optimizer: Any) -> bool:
    """Whether every rank's found_inf flag for ``optimizer``'s step is already the same, so that
    agreeing on it needs no collective (attribute reads only: no collective, no sync).

    True under auto-parallel (Paddle's SPMD rules reduced the flag; not under auto-dp, whose
    gradients are each rank's own addend before the step) and on the ``"local"`` layout
    when every parameter's gradient was reduced before the step (``paddle.DataParallel``, fleet's
    plain data parallel, a Trainer's ``fused_allreduce_gradients``: after backward every rank
    holds the same gradients, so a NaN in one rank's batch is a NaN on every rank): where
    Paddle's own scaler and torch's do no collective either. False under fleet's sharding,
    tensor and pipeline parallel and stage 2/3 (a rank holds its own unreduced gradients or its
    shard before the step), and when a parameter's gradient is left rank-local by the
    data-parallel all-reduce (``no_sync`` MoE experts, ``is_distributed`` shards): one
    all-reduce agrees the flag there.

    Args:
        optimizer: a Paddle optimizer or one of fleet's wrappers; anything without Paddle's
            parameter list is False (agree, to be safe).

    Returns:
        Whether no collective is needed to agree on the flag (it does not look at the world
        size: in one process no collective runs anyway).
    """
    layout = layout_of(optimizer)
    if layout.kind == "auto_parallel":
        return True
    if layout.kind != "local":
        return False
    try:
        params = _compat.optimizer_parameters(optimizer)
    except (AttributeError, TypeError):  # no Paddle parameter list: agree, to be safe
        return False
    return not any(_fleet.is_unsynced(p) for p in params)
