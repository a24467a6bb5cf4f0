"""The clip of a fleet step: on the reduced gradients, inside ``optimizer.step()``, by the global norm.

Fleet runs the optimizer's clip after it reduced the gradients (sharding, data parallel under
hybrid configs) and on the rank's own share of them (sharding, tensor-parallel shards, pipeline
stages, stage 2/3); the norm is the sum of the ranks' squares, reduced over fleet's groups, with
replicated parameters counted once. :func:`step_clipped` puts the requested clip where fleet
runs its own, for one step, and keeps the global norm:

- ``HybridParallelOptimizer``: fleet's own ``HybridParallelClipGrad`` (same reductions, same
  arithmetic, so the weights equal a run with ``ClipGradByGlobalNorm`` on the optimizer);
- stage 2/3: :class:`GroupShardedNormClip`, ``GroupShardedClipGrad``'s arithmetic (the sliced
  squares all-reduced over the sharding group, the unsliced ones added once).

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

from .. import _compat
from .._compat import fleet as _fleet
from ..clip import global_norm, scale_to_norm_
from ..gradients import clippable
from .flags import host_bool
from .layout import layout_of


def _sum_of_squares(grads: List[paddle.Tensor]) -> paddle.Tensor:
    squares = [_compat.squared_l2_norm(g.astype("float32")).reshape([1]) for g in grads]
    return paddle.stack(squares).sum().reshape([1]) if squares else paddle.zeros([1], dtype="float32")


class GroupShardedNormClip:
    """Stage 2/3's global-norm clip (``GroupShardedClipGrad``'s arithmetic) that keeps the norm.

    Called by the optimizer's step with its ``(param, grad)`` pairs: one all-reduce (SUM) of one
    float32 over the sharding group. ``clip_norm=None`` reduces the norm only.
    """

    def __init__(self, clip_norm: Optional[float], group: Any) -> None:
        self.clip_norm = clip_norm
        self.norm: Optional[paddle.Tensor] = None
        self._group = group

    @paddle.no_grad()
    def __call__(self, params_grads: list) -> list:
        pairs = clippable(params_grads)  # fleet passes the pairs its step applies
        sliced = _sum_of_squares([g for p, g in pairs if not _fleet.is_unsliced(p)])
        paddle.distributed.all_reduce(sliced, group=self._group)
        self.norm = paddle.sqrt(sliced + _sum_of_squares([g for p, g in pairs if _fleet.is_unsliced(p)]))
        if self.clip_norm is not None:
            scale_to_norm_([g for _, g in pairs], self.norm, self.clip_norm)
        return params_grads


class LocalNormClip:
    """``ClipGradByGlobalNorm``'s arithmetic (:func:`paddle_amp_ext.clip.clip_grads_`'s) on gradients
    whose norm needs no reduction of ours (auto-parallel: Paddle's SPMD rules reduce it), that keeps
    the norm. Called by the optimizer's step with its ``(param, grad)`` pairs; ``clip_norm=None``
    measures only."""

    def __init__(self, clip_norm: Optional[float]) -> None:
        self.clip_norm = clip_norm
        self.norm: Optional[paddle.Tensor] = None

    @paddle.no_grad()
    def __call__(self, params_grads: list) -> list:
        grads = [g for p, g in params_grads if g is not None and getattr(p, "need_clip", True) is not False]
        self.norm = global_norm(grads)
        if self.clip_norm is not None and self.norm is not None:
            scale_to_norm_(grads, self.norm, self.clip_norm)
        return params_grads


class _StepClip:
    """What the optimizer's step calls as its clip: the recording clip on the chosen
    parameters' pairs, then a per-tensor clip of ours on them, then the optimizer's own clip."""

    def __init__(self, recorder: Any, per_tensor: Any, own: Any, chosen: Optional[set]) -> None:
        self._recorder, self._per_tensor, self._own, self._chosen = recorder, per_tensor, own, chosen
        #: judge the reduced global norm (one host read) and hand the optimizer nothing when it is inf/nan
        self.skip_nonfinite = False
        self.skipped = False

    @property
    def norm(self) -> Optional[paddle.Tensor]:
        return self._recorder.norm

    def _on_chosen(self, clip: Any, params_grads: list) -> list:
        if self._chosen is None:
            return clip(params_grads)
        done = {id(p): (p, g) for p, g in clip([pg for pg in params_grads if id(pg[0]) in self._chosen])}
        return [done.get(id(p), (p, g)) for p, g in params_grads]

    def __call__(self, params_grads: list) -> list:
        params_grads = self._on_chosen(self._recorder, params_grads)
        if self.skip_nonfinite and self.norm is not None:
            self.skipped = host_bool(paddle.logical_not(paddle.isfinite(self.norm)))
            if self.skipped:
                return []
        if self._per_tensor is not None:
            params_grads = self._on_chosen(self._per_tensor, params_grads)
        return self._own(params_grads) if self._own is not None else params_grads


def _recorder(optimizer: Any, clip: Any) -> Any:
    layout = layout_of(optimizer)
    if layout.kind == "hybrid":
        return _fleet.recording_hybrid_clip(clip, layout.group, optimizer)
    if layout.kind == "group_sharded":
        return GroupShardedNormClip(None if clip is None else clip.clip_norm, layout.group)
    return LocalNormClip(None if clip is None else clip.clip_norm)


def _step_clip(optimizer: Any, clip: Any, parameters: Optional[Iterable[paddle.Tensor]]) -> _StepClip:
    own = _fleet.current_clip(optimizer)
    chosen = None if parameters is None else {id(p) for p in parameters}
    if clip is None and isinstance(own, _fleet.FLEET_CLIPS):  # fleet's own clip, recording
        return _StepClip(_recorder(optimizer, _fleet.inner_clip(own)), None, None, None)
    if clip is None and isinstance(own, paddle.nn.ClipGradByGlobalNorm) and layout_of(optimizer).norm_is_global:
        return _StepClip(_recorder(optimizer, own), None, None, None)  # the optimizer's own clip, recording
    by_norm = clip if isinstance(clip, paddle.nn.ClipGradByGlobalNorm) else None
    return _StepClip(_recorder(optimizer, by_norm), None if by_norm is not None else clip, own, chosen)


def step_clipped(optimizer: Any, clip: Any, want_norm: bool,
                 parameters: Optional[Iterable[paddle.Tensor]] = None) -> Optional[paddle.Tensor]:
    """``optimizer.step()`` of a fleet optimizer, with ``clip`` on the gradients it applies.

    Args:
        optimizer: a fleet optimizer whose step reduces the gradients
            (``layout_of(optimizer).clips_in_step``).
        clip: None or a Paddle clip (:func:`paddle_amp_ext.clip.resolve_clip`).
        want_norm: compute the global norm also without a clip (fleet's norm collectives:
            one to three small all-reduces); free when the optimizer has fleet's clip.
        parameters: clip (and measure) only these parameters' gradients; default: all the
            optimizer steps.

    Returns:
        The global gradient norm before clipping, identical on every rank (a 1-element device
        tensor), or None when neither a clip nor the norm was asked for.
    """
    if clip is None and not want_norm and not isinstance(_fleet.current_clip(optimizer), _fleet.FLEET_CLIPS):
        optimizer.step()
        return None
    step_clip = _step_clip(optimizer, clip, parameters)
    undo = _fleet.swap_clip(optimizer, step_clip)
    try:
        optimizer.step()
    finally:
        undo()
    return step_clip.norm


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


def step_unless_nonfinite(optimizer: Any, clip: Any) -> Tuple[Optional[paddle.Tensor], bool]:
    """:func:`step_clipped` whose skip decision rides on the clip's reduced global norm (under
    fleet; under auto-parallel, the optimizer's own global-norm clip, whose norm Paddle's SPMD
    rules reduce: the norm is computed once, not once for the guard and once for the clip).

    Costs the clip's own norm collectives (fleet's: one to three small all-reduces) and one
    device-to-host read of whether the norm is finite: no found_inf all-reduce. Every rank
    reads the same reduced norm, so every rank makes the same decision. Only valid where
    :func:`norm_covers_every_grad`.

    Returns:
        (the global norm, identical on every rank; whether it was inf/nan and nothing was updated).
    """
    step_clip = _step_clip(optimizer, clip, None)
    step_clip.skip_nonfinite = True
    undo = _fleet.swap_clip(optimizer, step_clip)
    try:
        optimizer.step()
    finally:
        undo()
    return step_clip.norm, step_clip.skipped
