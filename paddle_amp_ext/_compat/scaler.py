"""``paddle.amp.GradScaler`` internals.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1): the attributes ``_unscale`` reads and
writes: ``_enable``, ``_scale``, ``_found_inf``, ``_temp_found_inf_{value_false,fp16,bf16,fp32}``
and ``_optimizer_states`` (the per-optimizer INIT/UNSCALED/STEPPED state). Paddle 2.6 builds none
of them when the scaler is disabled (no bypass in its constructor), so :func:`init_scaler_state`
builds them for both versions. :func:`unscale` runs ``_unscale``'s own kernel,
``_legacy_C_ops.check_finite_and_unscale`` (one launch per gradient dtype, OR-ed by
``_C_ops.bitwise_or``), on the gradients the caller names (the ones the step applies:
:mod:`paddle_amp_ext.gradients`; Paddle's ``_unscale`` reads every ``_grad_ivar()``, frozen
parameters' too, and never a ``main_grad``) on a GPU, and on a CPU the CUDA kernel's arithmetic
(:func:`.cuda_unscale.unscale_as_cuda`: Paddle's CPU kernel zeroes every tensor from the first
non-finite one on); DistTensor gradients (auto-parallel), which Paddle's ``_unscale`` refuses, by
:func:`.autoparallel.check_finite_and_unscale_` (on a CPU the same CUDA arithmetic on their local
values, on a GPU Paddle's kernel, as ``dist.shard_scaler``). Fleet replaces ``_unscale`` on
the scaler instance (``fleet.distributed_scaler``, ``GroupShardedScaler``, and
``mix_precision_utils.MixPrecisionScaler``, which stores found_inf as a Python int and keeps no
optimizer state); that replacement then runs instead. After ``step()``/``minimize()`` Paddle sets a cached found_inf
flag that programs read to learn whether the optimizer ran (PaddleNLP's Trainer does): it is
``_cache_found_inf`` on 3.x and ``_cache_founf_inf`` (sic) on 2.6.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterable

import paddle
from paddle import _C_ops, _legacy_C_ops
from paddle.amp.grad_scaler import OptimizerState, _refresh_optimizer_state

from . import autoparallel
from .cuda_unscale import unscale_as_cuda

if TYPE_CHECKING:
    from paddle import Tensor


def init_scaler_state(scaler: Any, init_loss_scaling: float) -> None:
    """Give a ``paddle.amp.GradScaler`` built with ``enable=False`` the state ``_unscale`` reads.

    Works on 2.6 (whose constructor builds nothing when disabled) and 3.x alike.
    """
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


def unscale(scaler: Any, optimizer: Any, grads: list[Tensor], *, own: bool = False) -> Any:
    """Divide ``grads`` (the gradients the optimizer's step applies) by the scale in place;
    return found_inf.

    On a GPU (any place but the CPU) by Paddle's ``check_finite_and_unscale`` kernel, as
    ``_unscale`` groups them; on the CPU by :func:`unscale_as_cuda` (the CUDA kernel's
    arithmetic, not the CPU kernel's). Where fleet replaced ``_unscale`` on this scaler, that
    runs instead, on the gradients it collects itself. found_inf is a device flag, or the
    Python int fleet's ``MixPrecisionScaler`` stores (it read the flag back to the host itself).
    ``own=True`` runs this arithmetic also where fleet replaced ``_unscale`` (the caller checked
    that the replacement differs only by a found_inf all-reduce it does not want:
    :func:`.fleet.unscale_needs_no_collective`); the flag is then this rank's own.
    The optimizer is marked UNSCALED also when fleet's ``_unscale`` ran
    (``fleet.distributed_scaler``, ``GroupShardedScaler``: theirs leaves the state alone, so
    ``step()`` would unscale again).

    Raises:
        RuntimeError: Paddle's message, when the optimizer was already unscaled or stepped
            since the last update.
    """
    state = scaler._optimizer_states[id(optimizer)]
    if state["state"] is OptimizerState.UNSCALED:
        raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
    if state["state"] is OptimizerState.STEPPED:
        raise RuntimeError("unscale_() is being called after step().")
    if "_unscale" in vars(scaler) and not own:  # fleet's, bound to this instance
        scaler._unscale(optimizer)
    elif grads and autoparallel.is_dist(grads[0]):  # Paddle's _unscale refuses DistTensor gradients
        scaler._found_inf = autoparallel.check_finite_and_unscale_(grads, scaler._scale)
    elif grads and grads[0].place.is_cpu_place():
        scaler._found_inf = unscale_as_cuda(grads, scaler._scale)
    else:
        scaler._found_inf = _check_finite_and_unscale(scaler, grads)
    state["state"] = OptimizerState.UNSCALED
    return scaler._found_inf


def _check_finite_and_unscale(scaler: Any, grads: Iterable[Tensor]) -> Tensor:
    """Paddle's ``_unscale`` arithmetic: one ``check_finite_and_unscale`` launch per float16 /
    bfloat16 / other group, the flags OR-ed."""
    fp16: list = []
    bf16: list = []
    other: list = []
    for grad in grads:
        dtype = grad.dtype
        (fp16 if dtype == paddle.float16 else bf16 if dtype == paddle.bfloat16 else other).append(grad)
    found = scaler._temp_found_inf_value_false
    for group, flag in ((fp16, scaler._temp_found_inf_fp16), (bf16, scaler._temp_found_inf_bf16),
                        (other, scaler._temp_found_inf_fp32)):
        if group:
            _legacy_C_ops.check_finite_and_unscale(group, scaler._scale, group, flag)
            found = _C_ops.bitwise_or(found, flag)
    return found


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
    scaler._optimizer_states[id(optimizer)]["state"] = OptimizerState.STEPPED


def reset_optimizer_stages(scaler: Any) -> None:
    scaler._optimizer_states = defaultdict(_refresh_optimizer_state)


def paddle_scaler_view(scaler: Any) -> tuple[Tensor | None, Any]:
    """(scale tensor, cached found_inf) of a plain ``paddle.amp.GradScaler``, without a sync."""
    cached = getattr(scaler, "_cache_found_inf", None)
    if cached is None:
        cached = getattr(scaler, "_cache_founf_inf", None)
    return getattr(scaler, "_scale", None), cached
