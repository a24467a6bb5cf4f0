"""Every private Paddle access of paddle-amp-ext lives here.

The rest of the package uses Paddle's public API only. What this module relies on, and the
versions it was checked against (paddlepaddle 2.6.2 and 3.3.1, CPU builds; the GPU wheels share
the Python code):

- ``paddle.base.framework._dygraph_tracer()``: its ``_expected_place`` (which device AMP would run
  on) and ``_get_amp_op_list()`` (the white/black op lists in force inside ``auto_cast``).
- ``paddle.base.core.get_all_op_names()`` and ``core._get_registered_phi_kernels('all')``: the op
  registry that custom op lists are validated against; ``paddle.amp.amp_lists``: Paddle's defaults.
- ``paddle.amp.auto_cast.amp_global_state().amp_dtype``: Paddle's scaler disables itself in
  ``scale()`` unless this is ``'float16'``; fp16 emulation sets it.
- ``paddle.amp.GradScaler`` internals: ``_unscale`` (the real ``check_finite_and_unscale`` op and
  the per-optimizer READY/UNSCALED/STEPPED state), and the attributes it reads: ``_enable``,
  ``_scale``, ``_found_inf``, ``_temp_found_inf_{value_false,fp16,bf16,fp32}``,
  ``_optimizer_states``. Paddle 2.6 builds none of them when the scaler is disabled (no bypass in
  its constructor), so :func:`init_scaler_state` builds them for both versions. Paddle's cached
  flag is ``_cache_found_inf`` on 3.x and ``_cache_founf_inf`` (sic) on 2.6.
- ``Tensor._grad_ivar()``: the gradient tensor the optimizer really reads (``Tensor.grad`` is a
  copy-on-access view on both versions, so in-place clipping must go through this).
- ``paddle._C_ops.squared_l2_norm`` (the fused kernel ``paddle.nn.ClipGradByGlobalNorm`` uses) and
  ``paddle._C_ops.multiply_`` (in-place multiply without the Python-side argument binding that
  ``Tensor.multiply_`` pays on 2.6).
- ``Optimizer._parameter_list`` / ``_param_groups``: an optimizer's parameters.
- hapi: ``paddle.Model._scaler`` (the GradScaler ``Model.fit(amp_configs=...)`` builds in dygraph).
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterator

import paddle

if TYPE_CHECKING:
    from paddle import Tensor


def _parse_version(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


PADDLE_VERSION: tuple[int, int, int] = _parse_version(paddle.__version__)


# --------------------------------------------------------------------------- tracer and place
def _tracer() -> Any:
    from paddle.base.framework import _dygraph_tracer

    return _dygraph_tracer()


def place_kind() -> str:
    """Where eager ops run now: ``'gpu'``, ``'xpu'``, ``'custom'`` or ``'cpu'``."""
    tracer = _tracer()
    if tracer is None:
        return "cpu"
    place = tracer._expected_place
    if place.is_gpu_place():
        return "gpu"
    if place.is_xpu_place():
        return "xpu"
    if place.is_custom_place():
        return "custom"
    return "cpu"


def tracer_op_lists() -> tuple[frozenset[str], frozenset[str]]:
    """The (white, black) op lists in force in the tracer right now."""
    white, black = _tracer()._get_amp_op_list()
    return frozenset(white), frozenset(black)


def tracer_amp_level() -> str:
    """The tracer's AMP level as ``'O0'``, ``'O1'``, ``'O2'`` or ``'OD'``."""
    return str(_tracer()._amp_level).rsplit(".", 1)[-1]


# --------------------------------------------------------------------------- op registry
@functools.cache
def registered_op_names() -> frozenset[str]:
    """Every op type name the installed Paddle knows (ops, phi kernels, AMP defaults)."""
    from paddle.base import core

    names: set[str] = set(core.get_all_op_names())
    try:
        names.update(core._get_registered_phi_kernels("all"))
    except (AttributeError, TypeError, RuntimeError):  # pragma: no cover - older builds
        pass
    for dtype in ("float16", "bfloat16"):
        for level in ("O1", "O2"):
            white, black = default_op_lists(dtype, level)
            names.update(white)
            names.update(black)
    return frozenset(names)


def default_op_lists(dtype: str, level: str) -> tuple[frozenset[str], frozenset[str]]:
    """Paddle's own (white, black) lists for ``dtype`` and ``level``."""
    from paddle.amp import amp_lists

    return (
        frozenset(amp_lists.white_list()[dtype][level]),
        frozenset(amp_lists.black_list()[dtype][level]),
    )


# --------------------------------------------------------------------------- AMP global state
def amp_state_dtype() -> str:
    """The dtype Paddle's scaler checks in ``scale()`` (``'float32'`` before any auto_cast)."""
    from paddle.amp.auto_cast import amp_global_state

    return str(amp_global_state().amp_dtype)


def set_amp_state_dtype(dtype: str) -> str:
    """Set Paddle's global AMP dtype; return the previous value."""
    from paddle.amp.auto_cast import amp_global_state

    state = amp_global_state()
    previous = str(state.amp_dtype)
    state.amp_dtype = dtype
    return previous


def autocast_enabled() -> bool:
    """Whether the innermost ``paddle.amp.auto_cast`` context asked for AMP (False outside)."""
    from paddle.amp import auto_cast as auto_cast_module

    state = auto_cast_module.amp_state()
    return bool(state and state.get("enable", False))


# --------------------------------------------------------------------------- scaler internals
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
    set_scaler_scale(scaler, init_loss_scaling)


def set_scaler_enabled(scaler: Any, enabled: bool) -> None:
    scaler._enable = enabled


def set_scaler_scale(scaler: Any, value: float) -> None:
    """Store ``value`` in the device tensor ``_unscale`` divides by (a host-to-device copy)."""
    scaler._init_loss_scaling = value
    scaler._scale = paddle.to_tensor([value], dtype="float32")


def scaler_scale_tensor(scaler: Any) -> Tensor:
    return scaler._scale


def unscale(scaler: Any, optimizer: Any) -> Tensor:
    """Run Paddle's ``check_finite_and_unscale`` on the optimizer's grads; return found_inf.

    Raises Paddle's RuntimeError when the optimizer was already unscaled or stepped.
    """
    scaler._unscale(optimizer)
    return scaler._found_inf


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


def hapi_scaler(model: Any) -> Any:
    """The GradScaler a ``paddle.Model`` built for ``amp_configs`` (None without AMP)."""
    return getattr(model, "_scaler", None)


# --------------------------------------------------------------------------- parameters and grads
def optimizer_parameters(optimizer: Any) -> list[Tensor]:
    groups = getattr(optimizer, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        return [p for group in groups for p in group["params"]]
    return list(optimizer._parameter_list or [])


def grad_of(param: Tensor) -> Tensor | None:
    """The gradient tensor the optimizer reads; in-place changes to it reach the update."""
    return param._grad_ivar()


def squared_l2_norm(x: Tensor) -> Tensor:
    """sum(x**2) as a 1-element tensor of ``x``'s dtype, in one fused kernel (Paddle's clip's)."""
    return paddle._C_ops.squared_l2_norm(x)


def multiply_inplace(x: Tensor, factor: Tensor) -> None:
    """``x *= factor`` in place (``factor`` broadcast, same dtype as ``x``)."""
    paddle._C_ops.multiply_(x, factor)


def iter_grads(params: list[Tensor]) -> Iterator[Tensor]:
    for param in params:
        grad = param._grad_ivar()
        if grad is not None:
            yield grad
