"""Fleet internals: which wrapper an optimizer is, where its clip sits, how fleet sums the norm.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1, read in their sources and run on a
CPU with gloo):

- ``HybridParallelOptimizer`` (``fleet.distributed_optimizer`` under hybrid configs): its
  ``_inner_opt`` chain (``DygraphShardingOptimizer``/``V2``, ``MixPrecisionOptimizer``, the
  Paddle optimizer), ``_hcg`` and ``_use_dp_mode`` (True when the parallel mode is plain data
  parallel: the gradients were all-reduced in backward; otherwise ``step()`` reduces them over
  the sharding and data-parallel groups first, then runs the inner optimizer).
- ``HybridParallelClipGrad`` (what fleet puts in place of a ``ClipGradByGlobalNorm``): its
  constructor's first two arguments ``(clip, hcg)`` (3.3 adds ``split_norm_comm``, ``timers``),
  ``_clip``, ``_dygraph_clip`` (per-dtype squared norms split into distributed and replicated
  parameters, shared-weight copies counted once) which calls ``_comm_and_clip(params_grads,
  dist, not_dist)``, which calls ``_global_norm(dist, not_dist)``: the in-place all-reduces over
  the sharding, model-parallel and pipeline groups, after which ``sqrt(dist + not_dist)`` is the
  global norm it clips by.
- Stage 2/3 (``group_sharded_parallel``): the optimizer carries ``_optim`` (the Paddle
  optimizer that steps, itself for stage 3) and ``_group`` (the sharding group);
  ``GroupShardedClipGrad`` has ``_clip``; a parameter that stage 3 does not slice has an
  ``unslice`` attribute. ``GroupShardedScaler`` and ``fleet.distributed_scaler`` replace the
  scaler's ``_unscale`` by a bound function of their own module that all-reduces found_inf
  (MAX) over the whole world; ``distributed_scaler``'s is the closure
  ``distributed_scaler.<locals>.unscale_method`` of ``paddle.distributed.fleet.scaler``, which
  reads ``fleet.fleet._user_defined_strategy.hybrid_configs["sharding_configs"].comm_overlap``.
- ``paddle.DataParallel`` all-reduces every trainable gradient in backward except those of
  parameters marked ``no_sync`` or (under model parallel) ``is_distributed``.
- The optimizer's clip lives in ``_grad_clip`` (and ``"grad_clip"`` of each param group), read
  by ``Optimizer._apply_optimize`` at every step.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import paddle
from paddle.distributed.fleet.base.topology import ParallelMode
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelClipGrad,
    HybridParallelOptimizer,
)
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import GroupShardedClipGrad

from .autoparallel import shard_scaled

FLEET_CLIPS = (HybridParallelClipGrad, GroupShardedClipGrad)


def _own(obj: Any) -> dict:
    """``obj``'s instance attributes (empty for objects without a ``__dict__``: ints, slotted ones)."""
    return getattr(obj, "__dict__", None) or {}


def hybrid_group(optimizer: Any) -> Any:
    """The hybrid communicate group of a fleet optimizer whose ``step()`` reduces gradients
    (sharding, tensor, pipeline parallel), else None (plain data parallel, not fleet)."""
    opt = optimizer
    while opt is not None:
        if isinstance(opt, HybridParallelOptimizer):
            hcg = opt._hcg
            return None if hcg.get_parallel_mode() == ParallelMode.DATA_PARALLEL else hcg
        opt = _own(opt).get("_inner_opt")
    return None


def group_sharded_group(optimizer: Any) -> Any:
    """The sharding group of a stage 2/3 optimizer (``group_sharded_parallel``), else None."""
    if "_optim" in _own(optimizer) and "_group" in _own(optimizer):
        return optimizer._group
    return None


def base_optimizer(optimizer: Any) -> Any:
    """The Paddle optimizer at the bottom of fleet's wrappers: the one whose ``_grad_clip`` runs."""
    opt = optimizer
    while True:
        inner = _own(opt).get("_inner_opt", None) or _own(opt).get("_optim", None)
        if inner is None or inner is opt:
            return opt
        opt = inner


def swap_clip(optimizer: Any, clip: Any) -> Callable[[], None]:
    """Put ``clip`` where the base optimizer's step reads its clip; return the undo function."""
    base = base_optimizer(optimizer)
    old = base._grad_clip
    groups = [g for g in (getattr(base, "_param_groups", None) or []) if isinstance(g, dict) and "grad_clip" in g]
    old_groups = [g["grad_clip"] for g in groups]
    base._grad_clip = clip
    for group in groups:
        group["grad_clip"] = clip

    def undo() -> None:
        base._grad_clip = old
        for group, value in zip(groups, old_groups):
            group["grad_clip"] = value

    return undo


def current_clip(optimizer: Any) -> Any:
    return base_optimizer(optimizer)._grad_clip


def inner_clip(clip: Any) -> Any:
    """The Paddle clip a fleet clip wraps (``ClipGradByGlobalNorm``), or ``clip`` itself."""
    return clip._clip if isinstance(clip, FLEET_CLIPS) else clip


def is_unsliced(param: paddle.Tensor) -> bool:
    """Whether stage 3 keeps this parameter whole on every rank (its norm is counted once)."""
    return hasattr(param, "unslice")


def is_unsynced(param: paddle.Tensor) -> bool:
    """Whether the data-parallel all-reduce leaves this parameter's gradient rank-local:
    ``paddle.DataParallel`` (and fleet's data parallel built on it) skips parameters marked
    ``no_sync`` (MoE experts) and, under model parallel, ``is_distributed`` ones (tensor-parallel
    shards); ``fused_allreduce_gradients`` skips ``no_sync`` ones too (``distributed/parallel.py``,
    ``fleet/utils/hybrid_parallel_util.py``, 2.6.2 and 3.3.1). Attribute reads only."""
    return bool(getattr(param, "no_sync", False)) or bool(getattr(param, "is_distributed", False))


def unscale_reduces_found_inf(scaler: Any) -> bool:
    """Whether fleet (or ``dist.shard_scaler``, :func:`.autoparallel.shard_scaled`) replaced
    ``scaler._unscale`` by one that agrees found_inf itself."""
    method = _own(scaler).get("_unscale")
    func = getattr(method, "__func__", None)
    if func is None:
        return False
    return getattr(func, "__module__", "").startswith("paddle.distributed.fleet") or shard_scaled(scaler)


def unscale_needs_no_collective(scaler: Any) -> bool:
    """Whether ``scaler``'s gradients can be unscaled without a collective, by Paddle's arithmetic
    on the gradients the step applies: it has no ``_unscale`` of an instance's own, or
    ``fleet.distributed_scaler``'s, which differs from Paddle's ``_unscale`` only by its found_inf
    all-reduce (and reads ``main_grad`` where set, as :mod:`paddle_amp_ext.gradients` does) while
    sharding's ``comm_overlap`` is off (with it on, it also scales fleet's comm buffers)."""
    method = _own(scaler).get("_unscale")
    if method is None:
        return True
    func = getattr(method, "__func__", None)
    if (getattr(func, "__module__", "") != "paddle.distributed.fleet.scaler"
            or getattr(func, "__qualname__", "") != "distributed_scaler.<locals>.unscale_method"):
        return False
    try:
        strategy = paddle.distributed.fleet.fleet._user_defined_strategy
        return not strategy.hybrid_configs["sharding_configs"].comm_overlap
    except (AttributeError, KeyError, TypeError):
        return False


def split_norm_comm(optimizer: Any) -> bool:
    """3.3's ``hybrid_configs["split_norm_comm"]`` (False on 2.6, which has no such setting)."""
    strategy = getattr(optimizer, "_strategy", None)
    try:
        return bool(strategy.hybrid_configs["split_norm_comm"])
    except (AttributeError, KeyError, TypeError):
        return False


class RecordingHybridClip(HybridParallelClipGrad):
    """Fleet's own clip (same reductions, same arithmetic) that keeps the global norm.

    With ``clip=None`` it reduces the norm and leaves the gradients alone.
    """

    def __init__(self, clip: Any, hcg: Any, split: bool = False) -> None:
        super().__init__(clip, hcg)
        self.split_norm_comm = split  # 3.3's attribute; 2.6 never reads it
        self.norm: Optional[paddle.Tensor] = None

    def _global_norm(self, dist: paddle.Tensor, not_dist: paddle.Tensor) -> None:
        super()._global_norm(dist, not_dist)
        self.norm = paddle.sqrt(dist + not_dist).reshape([1])

    def _comm_and_clip(self, params_grads: list, dist: paddle.Tensor, not_dist: paddle.Tensor) -> list:
        if self._clip is not None:
            return super()._comm_and_clip(params_grads, dist, not_dist)
        self._global_norm(dist, not_dist)
        return params_grads


def recording_hybrid_clip(clip: Any, hcg: Any, optimizer: Any) -> Any:
    """A ``HybridParallelClipGrad`` for ``clip`` (a ``ClipGradByGlobalNorm`` or None: norm
    only) whose ``.norm`` is the global norm once the optimizer's step ran it."""
    return RecordingHybridClip(clip, hcg, split_norm_comm(optimizer))
