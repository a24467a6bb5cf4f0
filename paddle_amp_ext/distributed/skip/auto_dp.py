"""Auto-dp (``dist.enable_auto_dp()``): each rank's gradient is its own addend until the step.

PaddleFormers' ``Trainer(enable_auto_parallel=True)`` turns it on. A gradient claims
``Replicate`` but holds this rank's unreduced addend; ``Optimizer._apply_optimize`` relabels it
``Partial`` before the clip and the update, whose SPMD rules reduce it
(:mod:`paddle_amp_ext._compat.autoparallel`). So:

- a flag computed before the step is this rank's own, whatever its label: it is reduced once,
  ``MAX`` over the mesh (one all-reduce of one bool, Paddle's reshard of a ``Partial(MAX)`` flag
  built from this rank's local flag), also after ``dist.shard_scaler``'s ``_unscale``, whose flag
  believes the label;
- the clip runs inside the step, after the relabel, where its norm is global: a skip with a
  global-norm clip (ours or the optimizer's own) rides on that norm with no collective of ours.
"""

from __future__ import annotations

from typing import Any, Optional

import paddle

from ..._compat import autoparallel as _ap
from ..flags import Flag, checked_flag
from .base import SkipStrategy


class AutoDataParallel(SkipStrategy):
    """The auto-dp layout: fake ``Replicate`` gradients taken for what they are, each rank's addend."""

    name = "auto_dp"
    gradients = "this rank's own addend, labelled Replicate"
    clips_in_step = True
    own_clip_is_global = True
    guard_rides_on_own_clip = True

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        return reduce_local_max(flag, self.layout.group)


def reduce_local_max(flag: Flag, mesh: Any = None) -> paddle.Tensor:
    """This rank's local found_inf OR-ed over ``mesh`` (default: every rank), whatever the
    placements of ``flag`` claim: one all-reduce of one bool (Paddle's reshard of a
    ``Partial(MAX)`` DistTensor), which every rank of the mesh must enter.

    Args:
        flag: this rank's flag: a 1-element tensor (dense or DistTensor: its local value is
            used) or a Python number.
        mesh: the ``ProcessMesh`` of the gradients; None: a 1-D mesh of every rank (where
            Paddle puts a dense gradient under auto-dp).

    Returns:
        A ``Replicate`` bool DistTensor, the same on every rank.
    """
    flag = checked_flag(flag)
    local = _ap.local_value(flag) if isinstance(flag, paddle.Tensor) else paddle.to_tensor([bool(flag)])
    local = local.astype("bool").reshape([1])
    if mesh is None:
        mesh = paddle.distributed.ProcessMesh(list(range(paddle.distributed.get_world_size())), dim_names=["dp"])
    maximum = paddle.distributed.Partial(paddle.distributed.ReduceType.kRedMax)
    placements = [maximum if size > 1 else paddle.distributed.Replicate() for size in mesh.shape]
    return _ap.replicated(_ap.from_local(local, mesh, placements))
