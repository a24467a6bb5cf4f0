"""The clip of a step whose optimizer reduces the gradients: inside ``optimizer.step()``, by the global norm.

Fleet runs the optimizer's clip after it reduced the gradients (sharding, data parallel under
hybrid configs) and on the rank's own share of them (sharding, tensor-parallel shards, pipeline
stages, stage 2/3); the norm is the sum of the ranks' squares, reduced over fleet's groups, with
replicated parameters counted once. Under auto-dp the step relabels each rank's addend
``Partial`` first, and the clip's norm is reduced by Paddle's SPMD rules. :func:`step_clipped`
puts the requested clip where the step runs its own, for one step, and keeps the global norm,
through the recorder the optimizer's skip strategy names
(:meth:`~paddle_amp_ext.distributed.skip.SkipStrategy.recorder`):

- ``HybridParallelOptimizer``: fleet's own ``HybridParallelClipGrad`` (same reductions, same
  arithmetic, so the weights equal a run with ``ClipGradByGlobalNorm`` on the optimizer);
- stage 2/3: :class:`~paddle_amp_ext.distributed.clips.GroupShardedNormClip`;
- auto-parallel, auto-dp: :class:`~paddle_amp_ext.distributed.clips.LocalNormClip`.

:func:`step_unless_nonfinite` lets the skip decision ride on that reduction: a non-finite gradient
on any rank makes the reduced global norm non-finite on every rank, so when the norm covers every
gradient no separate found_inf all-reduce is needed; the clip then hands the optimizer no
gradients, and nothing is updated.

The optimizer's own clip still runs, after ours (as on the local path, where the scaler clips
before the optimizer's step clips again); without a clip of ours, fleet's own global-norm clip
is replaced for the step by the same clip that also records the norm.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

import paddle

from .._compat import fleet as _fleet
from .clips import GroupShardedNormClip, LocalNormClip, StepClip
from .skip import SkipStrategy, strategy_of

__all__ = ["GroupShardedNormClip", "LocalNormClip", "norm_covers_every_grad", "step_clipped",
           "step_unless_nonfinite"]


def _step_clip(optimizer: Any, clip: Any, parameters: Optional[Iterable[paddle.Tensor]],
               strategy: SkipStrategy, skip_nonfinite: bool) -> StepClip:
    own = _fleet.current_clip(optimizer)
    if clip is None and isinstance(own, _fleet.FLEET_CLIPS):  # fleet's own clip, recording
        return StepClip(strategy.recorder(optimizer, _fleet.inner_clip(own)), skip_nonfinite=skip_nonfinite)
    if clip is None and isinstance(own, paddle.nn.ClipGradByGlobalNorm) and strategy.own_clip_is_global:
        return StepClip(strategy.recorder(optimizer, own), skip_nonfinite=skip_nonfinite)  # the optimizer's own
    chosen = None if parameters is None else {id(p) for p in parameters}
    by_norm = clip if isinstance(clip, paddle.nn.ClipGradByGlobalNorm) else None
    return StepClip(strategy.recorder(optimizer, by_norm), None if by_norm is not None else clip, own, chosen,
                    skip_nonfinite)


def _checked(strategy: Optional[SkipStrategy], optimizer: Any) -> SkipStrategy:
    if strategy is None:
        return strategy_of(optimizer)
    if not isinstance(strategy, SkipStrategy):
        raise TypeError(f"strategy must be a SkipStrategy (from paddle_amp_ext.distributed.strategy_of(optimizer)) "
                        f"or None. Received: {strategy!r} (of type {type(strategy).__name__})")
    return strategy


def _step_through(optimizer: Any, step_clip: StepClip) -> StepClip:
    undo = _fleet.swap_clip(optimizer, step_clip)
    try:
        optimizer.step()
    finally:
        undo()
    return step_clip


def step_clipped(optimizer: Any, clip: Any, want_norm: bool,
                 parameters: Optional[Iterable[paddle.Tensor]] = None,
                 strategy: Optional[SkipStrategy] = None) -> Optional[paddle.Tensor]:
    """``optimizer.step()`` of an optimizer whose step reduces the gradients, with ``clip`` on the
    gradients it applies.

    Args:
        optimizer: an optimizer whose skip strategy ``clips_in_step`` (fleet's hybrid and stage
            2/3, auto-dp).
        clip: None or a Paddle clip (:func:`paddle_amp_ext.clip.resolve_clip`).
        want_norm: compute the global norm also without a clip (fleet's norm collectives:
            one to three small all-reduces); free when the optimizer has fleet's clip.
        parameters: clip (and measure) only these parameters' gradients; default: all the
            optimizer steps.
        strategy: the optimizer's :class:`~paddle_amp_ext.distributed.skip.SkipStrategy`
            (default: :func:`~paddle_amp_ext.distributed.skip.strategy_of`).

    Returns:
        The global gradient norm before clipping, identical on every rank (a 1-element device
        tensor), or None when neither a clip nor the norm was asked for.

    Raises:
        TypeError: ``strategy`` is not a ``SkipStrategy`` (before any step).
    """
    strategy = _checked(strategy, optimizer)
    if clip is None and not want_norm and not isinstance(_fleet.current_clip(optimizer), _fleet.FLEET_CLIPS):
        optimizer.step()
        return None
    return _step_through(optimizer, _step_clip(optimizer, clip, parameters, strategy, False)).norm


def norm_covers_every_grad(optimizer: Any, clip: Any, parameters: Optional[Iterable[paddle.Tensor]],
                           params: List[paddle.Tensor]) -> bool:
    """Whether the global norm :func:`step_unless_nonfinite` reduces sees every gradient the optimizer
    applies: a global-norm clip (``clip``, or fleet's own on the optimizer without one) over all of
    the optimizer's parameters, none with ``need_clip=False``."""
    if parameters is not None:
        return False
    if clip is None:
        own = _fleet.current_clip(optimizer)
        clip = _fleet.inner_clip(own) if isinstance(own, _fleet.FLEET_CLIPS) else own
    return isinstance(clip, paddle.nn.ClipGradByGlobalNorm) and all(
        getattr(p, "need_clip", True) is not False for p in params)


def step_unless_nonfinite(optimizer: Any, clip: Any,
                          strategy: Optional[SkipStrategy] = None) -> Tuple[Optional[paddle.Tensor], bool]:
    """:func:`step_clipped` whose skip decision rides on the clip's reduced global norm (under
    fleet and auto-dp; under auto-parallel, the optimizer's own global-norm clip, whose norm
    Paddle's SPMD rules reduce: the norm is computed once, not once for the guard and once for
    the clip).

    Costs the clip's own norm collectives (fleet's: one to three small all-reduces) and one
    device-to-host read of whether the norm is finite: no found_inf all-reduce. Every rank
    reads the same reduced norm, so every rank makes the same decision. Only valid where
    :func:`norm_covers_every_grad`.

    Args:
        optimizer: the optimizer.
        clip: None (the optimizer's own global-norm clip) or a ``ClipGradByGlobalNorm``.
        strategy: the optimizer's skip strategy (default: :func:`~paddle_amp_ext.distributed.skip.strategy_of`).

    Returns:
        (the global norm, identical on every rank; whether it was inf/nan and nothing was updated).

    Raises:
        TypeError: ``strategy`` is not a ``SkipStrategy`` (before any step).
    """
    step_clip = _step_through(optimizer, _step_clip(optimizer, clip, None, _checked(strategy, optimizer), True))
    return step_clip.norm, step_clip.skipped
