"""The clips the optimizer's step calls in place of its own: they keep the global norm they reduce.

- :class:`GroupShardedNormClip`: stage 2/3's global-norm clip (``GroupShardedClipGrad``'s
  arithmetic: the sliced squares all-reduced over the sharding group, the unsliced ones added once);
- :class:`LocalNormClip`: ``ClipGradByGlobalNorm``'s arithmetic on gradients whose norm needs no
  reduction of ours (one process, or DistTensors: Paddle's SPMD rules reduce it);
- fleet's own ``HybridParallelClipGrad`` that keeps the norm: :mod:`paddle_amp_ext._compat.fleet`;
- :class:`StepClip`: what the step calls: one of those (the recorder), then a per-tensor clip of
  ours, then the optimizer's own clip; it can judge the reduced norm and hand the optimizer
  nothing when it is inf/nan (the skip decision riding on the clip's reduction).
"""

from __future__ import annotations

from typing import Any, List, Optional

import paddle

from .. import _compat
from .._compat import fleet as _fleet
from ..clip import global_norm, scale_to_norm_
from ..gradients import clippable
from .flags import host_bool


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


class StepClip:
    """What the optimizer's step calls as its clip: the recording clip on the chosen
    parameters' pairs, then a per-tensor clip of ours on them, then the optimizer's own clip.

    With ``skip_nonfinite`` it reads whether the recorded (reduced) norm is finite (one host
    read, the same on every rank) and hands the optimizer no gradients when it is not.
    """

    def __init__(self, recorder: Any, per_tensor: Any = None, own: Any = None, chosen: Optional[set] = None,
                 skip_nonfinite: bool = False) -> None:
        self._recorder, self._per_tensor, self._own, self._chosen = recorder, per_tensor, own, chosen
        self.skip_nonfinite = skip_nonfinite
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
