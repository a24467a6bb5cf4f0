"""The skip decision: one strategy per distributed layout, chosen once per optimizer.

"Is this step skipped?" has one answer for every rank, or ranks disagree and a collective the
optimizer's step enters hangs. Each layout answers it with one :class:`SkipStrategy` (one file
each); the scaler (:class:`paddle_amp_ext.GradScaler`, loss scaling on and off) and
``guard_optimizer`` both ask it. The decision map:

Each row: layout (:func:`~paddle_amp_ext.distributed.layout_of`) -> strategy: the gradient a rank
holds before the step; what agrees a found_inf flag; the reduction the decision rides on instead
(no flag collective at all).

- one process -> :class:`SingleProcess`: the applied gradient; nothing; -.
- data parallel (``paddle.DataParallel``, fleet's plain dp) -> :class:`DataParallel`: reduced in
  backward; nothing (one MAX all-reduce over the world with ``no_sync``/``is_distributed``
  parameters); -.
- fleet hybrid (sharding, tensor, pipeline) -> :class:`FleetHybrid`: this rank's own or its
  shard; one MAX all-reduce over the world (or fleet's ``_unscale``'s); fleet's clip norm
  inside the step.
- stage 2/3 -> :class:`GroupSharded`: this rank's own or its slice; one MAX all-reduce over the
  world (or ``GroupShardedScaler``'s); the sharding group's norm all-reduce inside the step.
- auto-parallel (DistTensors) -> :class:`AutoParallel`: placements that tell the truth; Paddle's
  SPMD rules (the reshard of a ``Partial`` flag at its read); the optimizer's own global-norm clip.
- auto-dp (``dist.enable_auto_dp()``) -> :class:`AutoDataParallel`: this rank's addend labelled
  ``Replicate``; one MAX all-reduce of one bool over the mesh, whatever the label (also after
  ``dist.shard_scaler``'s ``_unscale``); the clip inside the step, ours or the optimizer's.

"Rides on": where a global-norm clip covers every gradient the step applies, the clip runs
inside ``optimizer.step()`` (:func:`~paddle_amp_ext.distributed.step_unless_nonfinite`) and the
decision is whether its reduced norm is finite: one host read and no flag collective. A
``GradScaler`` rides there when loss scaling is off, or on with the gradients not unscaled by
hand; ``guard_optimizer`` only under auto-dp, on an intercepted plain ``step()`` with the
optimizer's own clip (elsewhere the intercepted call applies the step: its flag is agreed
before it). A new layout is a new file here, an item above and an entry in
:data:`~paddle_amp_ext.distributed.skip.select.STRATEGIES`.
"""

from __future__ import annotations

from .auto_dp import AutoDataParallel, reduce_local_max
from .auto_parallel import AutoParallel
from .base import SkipStrategy
from .data_parallel import DataParallel
from .group_sharded import GroupSharded
from .hybrid import FleetHybrid
from .select import agree_found_inf, strategy_of
from .single import SingleProcess

__all__ = ["AutoDataParallel", "AutoParallel", "DataParallel", "FleetHybrid", "GroupSharded", "SingleProcess",
           "SkipStrategy", "agree_found_inf", "reduce_local_max", "strategy_of"]
