"""The clip of a fleet step: on the reduced gradients, inside ``optimizer.step()``, by the global norm.

Fleet runs the optimizer's clip after it reduced the gradients (sharding, data parallel under
hybrid configs) and on the rank's own slice of them (sharding, tensor-parallel shards, pipeline
stages, stage 2/3); the norm is the sum of the ranks' squares, reduced over fleet's groups, with
replicated parameters counted once. :func:`step_clipped` puts the requested clip where fleet
runs its own, for one step, and keeps the global norm:

- ``HybridParallelOptimizer``: fleet's own ``HybridParallelClipGrad`` (same reductions, same
  arithmetic, so the weights equal a run with ``ClipGradByGlobalNorm`` on the optimizer);
- stage 2/3: :class:`GroupShardedNormClip`, ``GroupShardedClipGrad``'s arithmetic (the sliced
  squares all-reduced over the sharding group, the unsliced ones added once).

A clip the optimizer already has (fleet's, or a per-tensor one) still runs: fleet's global-norm
clip is replaced by the same clip that also records the norm, any other runs after ours.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import paddle

from .. import _compat
from .._compat import fleet as _fleet
from ..clip import scale_to_norm_
from .layout import layout_of


def _sum_of_squares(grads: List[paddle.Tensor]) -> paddle.Tensor:
    squares = [_compat.squared_l2_norm(g.astype("float32")).reshape([1]) for g in grads]
    return paddle.stack(squares).sum().reshape([1]) if squares else paddle.zeros([1], dtype="float32")


class GroupShardedNormClip:
    """Stage 2/3's global-norm clip (``GroupShardedClipGrad``'s arithmetic) that keeps the norm.

    Called by the optimizer's step with its ``(param, grad)`` pairs: one all-reduce (SUM) of one
    float32 over the sharding group. ``clip_norm=None`` reduces the norm only.
    """

    def __init__(self, clip_norm: Optional[float], group: Any, then: Optional[Callable] = None) -> None:
        self.clip_norm = clip_norm
        self.norm: Optional[paddle.Tensor] = None
        self._group = group
        self._then = then

    @paddle.no_grad()
    def __call__(self, params_grads: list) -> list:
        pairs = [(p, g) for p, g in params_grads if g is not None and getattr(p, "need_clip", True) is not False]
        sliced = _sum_of_squares([g for p, g in pairs if not _fleet.is_unsliced(p)])
        paddle.distributed.all_reduce(sliced, group=self._group)
        self.norm = paddle.sqrt(sliced + _sum_of_squares([g for p, g in pairs if _fleet.is_unsliced(p)]))
        if self.clip_norm is not None:
            scale_to_norm_([g for _, g in pairs], self.norm, self.clip_norm)
        return self._then(params_grads) if self._then is not None else params_grads


def _chain(first: Any, second: Any) -> Optional[Callable]:
    if first is None or second is None:
        return first if second is None else second
    return lambda params_grads: second(first(params_grads))


def _probe(optimizer: Any, clip: Any) -> Any:
    """The clip to run inside this step, which records the global norm before clipping.

    Ours first, then the optimizer's own (as on the local path, where the scaler clips before
    the optimizer's step clips again); without ours, fleet's own global-norm clip is replaced
    by the same clip that records.
    """
    layout = layout_of(optimizer)
    own = _fleet.current_clip(optimizer)
    if clip is None and isinstance(own, _fleet.FLEET_CLIPS):
        return _probe_clip(layout, optimizer, _fleet.inner_clip(own), None)
    by_norm = clip if isinstance(clip, paddle.nn.ClipGradByGlobalNorm) else None
    return _probe_clip(layout, optimizer, by_norm, _chain(None if by_norm is not None else clip, own))


def _probe_clip(layout: Any, optimizer: Any, clip: Any, then: Optional[Callable]) -> Any:
    if layout.kind == "hybrid":
        return _fleet.recording_hybrid_clip(clip, layout.group, optimizer, then)
    return GroupShardedNormClip(None if clip is None else clip.clip_norm, layout.group, then)


def step_clipped(optimizer: Any, clip: Any, want_norm: bool) -> Optional[paddle.Tensor]:
    """``optimizer.step()`` of a fleet optimizer, with ``clip`` on the gradients it applies.

    Args:
        optimizer: a fleet optimizer whose step reduces the gradients
            (``layout_of(optimizer).clips_in_step``).
        clip: None or a Paddle clip (:func:`paddle_amp_ext.clip.resolve_clip`).
        want_norm: compute the global norm also without a clip (fleet's norm collectives:
            one to three small all-reduces); free when the optimizer has fleet's clip.

    Returns:
        The global gradient norm before clipping, identical on every rank (a 1-element device
        tensor), or None when neither a clip nor the norm was asked for.
    """
    if clip is None and not want_norm and not isinstance(_fleet.current_clip(optimizer), _fleet.FLEET_CLIPS):
        optimizer.step()
        return None
    probe = _probe(optimizer, clip)
    undo = _fleet.swap_clip(optimizer, probe)
    try:
        optimizer.step()
    finally:
        undo()
    return probe.norm
