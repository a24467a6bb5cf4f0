"""``paddle.amp.GradScaler`` internals.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1): ``_unscale`` (the real
``check_finite_and_unscale`` op and the per-optimizer READY/UNSCALED/STEPPED state), and the
attributes it reads: ``_enable``, ``_scale``, ``_found_inf``,
``_temp_found_inf_{value_false,fp16,bf16,fp32}``, ``_optimizer_states``. Paddle 2.6 builds none
of them when the scaler is disabled (no bypass in its constructor), so :func:`init_scaler_state`
builds them for both versions. After ``step()``/``minimize()`` Paddle sets a cached found_inf
flag that programs read to learn whether the optimizer ran (PaddleNLP's Trainer does): it is
``_cache_found_inf`` on 3.x and ``_cache_founf_inf`` (sic) on 2.6.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import paddle

if TYPE_CHECKING:
    from paddle import Tensor


def init_scaler_state(scaler: Any, init_loss_scaling: float) -> None:
    """Give a ``paddle.amp.GradScaler`` built with ``enable=False`` the state ``_unscale`` reads.

    Works on 2.6 (whose constructor builds nothing when disabled) and 3.x alike.
    """
    from paddle.amp.grad_scaler import _refresh_optimizer_state

    def flag() -> Tensor:
        return paddle.to_tensor([False], dtype="bool")

    scaler._found_inf = flag()
    scaler._temp_found_inf_value_false = flag()
    scaler._temp_found_inf_fp16 = flag()
    scaler._temp_found_inf_bf16 = flag()
    scaler._temp_found_inf_fp32 = flag()
    scaler._optimizer_states = defaultdict(_refresh_optimizer_state)
    scaler._cache_found_inf = None
    scaler._cache_founf_inf = None
    scaler._use_dynamic_loss_scaling = True
    scaler._incr_count = 0
    scaler._decr_count = 0
    scaler._init_loss_scaling = init_loss_scaling
    set_scaler_scale(scaler, init_loss_scaling)


def set_scaler_enabled(scaler: Any, enabled: bool) -> None:
    scaler._enable = enabled


def set_scaler_scale(scaler: Any, value: float) -> None:
    """Store ``value`` in the device tensor ``_unscale`` divides by (a host-to-device copy)."""
    scaler._scale = paddle.to_tensor([value], dtype="float32")


def scaler_scale_tensor(scaler: Any) -> Tensor:
    return scaler._scale


def unscale(scaler: Any, optimizer: Any) -> Tensor:
    """Run Paddle's ``check_finite_and_unscale`` on the optimizer's grads; return found_inf.

    Raises Paddle's RuntimeError when the optimizer was already unscaled or stepped. Marks the
    optimizer UNSCALED also when fleet replaced ``_unscale`` (``fleet.distributed_scaler``,
    ``GroupShardedScaler``: theirs leaves the state alone, so ``step()`` would unscale again).
    """
    from paddle.amp.grad_scaler import OptimizerState

    scaler._unscale(optimizer)
    scaler._optimizer_states[id(optimizer)]["state"] = OptimizerState.UNSCALED
    return scaler._found_inf


def set_found_flags(scaler: Any, found: Any = None, skipped: bool | None = None) -> None:
    """Set what Paddle's scaler exposes: ``_found_inf`` (a device flag) and, after a step, the
    cached host flag under both of its names (3.x ``_cache_found_inf``, 2.6 ``_cache_founf_inf``)."""
    if found is not None:
        scaler._found_inf = found
    if skipped is not None:
        scaler._cache_found_inf = skipped
        scaler._cache_founf_inf = skipped


def optimizer_stage(scaler: Any, optimizer: Any) -> str:
    """``'INIT'``, ``'UNSCALED'`` or ``'STEPPED'`` for this optimizer since the last update."""
    return scaler._optimizer_states[id(optimizer)]["state"].name


def mark_stepped(scaler: Any, optimizer: Any) -> None:
    from paddle.amp.grad_scaler import OptimizerState

    scaler._optimizer_states[id(optimizer)]["state"] = OptimizerState.STEPPED


def reset_optimizer_stages(scaler: Any) -> None:
    from paddle.amp.grad_scaler import _refresh_optimizer_state

    scaler._optimizer_states = defaultdict(_refresh_optimizer_state)


def paddle_scaler_view(scaler: Any) -> tuple[Tensor | None, Any]:
    """(scale tensor, cached found_inf) of a plain ``paddle.amp.GradScaler``, without a sync."""
    cached = getattr(scaler, "_cache_found_inf", None)
    if cached is None:
        cached = getattr(scaler, "_cache_founf_inf", None)
    return getattr(scaler, "_scale", None), cached
