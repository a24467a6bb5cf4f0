"""Every private Paddle access of paddle-amp-ext lives in this package.

The rest of the package uses Paddle's public API only. Each module says what it relies on; all
were checked against paddlepaddle 2.6.2 and 3.3.1 (CPU builds; the GPU wheels share the Python
code):

- :mod:`.tracer`: the dygraph tracer (place, AMP level, op lists), static/PIR mode, Paddle's
  default op lists, its global AMP state.
- :mod:`.opdefs`: the ops this build registers and every op Paddle defines for any backend
  (GPU-only, XPU-only, fused), for validating custom op lists.
- :mod:`.scaler`: ``paddle.amp.GradScaler`` internals (``_unscale``, the per-optimizer states,
  the flags Paddle programs read after ``step()``).
- :mod:`.cuda_unscale`: ``check_finite_and_unscale`` with the CUDA kernel's arithmetic on any
  place (for :mod:`.scaler`'s dense gradients and :mod:`.autoparallel`'s local values).
- :mod:`.optimizer`: optimizer parameters, gradient tensors (which optimizer reads
  ``main_grad``), the method that applies an update, fused norm kernels, hapi's scaler.
- :mod:`.fleet`: fleet's optimizer wrappers, its clips (how it reduces the global norm),
  stage 2/3's markers, the scalers it patches.
- :mod:`.layers`: how Paddle's layers reach their kernels on a GPU (the conv functions, ``F.linear``,
  which parameters ``decorate(level="O2")`` casts).
- :mod:`.kernels`: float16 rounding by ``paddle._C_ops`` kernels, or by the compiled one-pass
  kernel (:mod:`paddle_amp_ext._native`) through ``Tensor.data_ptr()``.
- :mod:`.tensors`: a fast float32 test of a tensor, a gradient hook without the public method's binding.
- :mod:`.autoparallel`: DistTensors (``dist.shard_tensor``...): their local values, their pending
  reductions, how a gradient of one is scaled and written as Paddle's clip does it, ``dist.shard_scaler``.
- :mod:`.matmul`: the float32 ``linear``/``matmul`` kernels and a tensor's in-place version,
  for the rehearsal's one-node Linear.
- :mod:`.backward`: which op outputs a grad node keeps (``Tensor.grad_fn``), from the table
  :mod:`.backward_table` generated from Paddle's grad op makers.
- :mod:`.probes`: Paddle's op-dtype statistics and its ``check_finite_and_unscale`` kernel, for
  ``check --verify``.
"""

from __future__ import annotations

from .autoparallel import is_dist, local_value, replicated
from .layers import gpu_linear_is_fused, o2_low_precision_layers
from .opdefs import (
    CUDA_ONLY_FLUID_OPS,
    op_of_api,
    ops_in_default_amp_lists,
    ops_paddle_defines,
    ops_this_build_registers,
)
from .optimizer import (
    applying_method,
    assign_grad,
    bound_scheduler,
    first_parameter,
    grad_of,
    hapi_scaler,
    multiply_inplace,
    optimizer_parameters,
    optimizer_wrapper_classes,
    squared_l2_norm,
)
from .scaler import (
    init_scaler_state,
    mark_stepped,
    optimizer_stage,
    paddle_scaler_view,
    reset_optimizer_stages,
    scaler_scale_tensor,
    set_found_flags,
    set_scaler_enabled,
    set_scaler_scale,
    unscale,
)
from .tracer import (
    PADDLE_VERSION,
    amp_state_dtype,
    autocast_enabled,
    default_op_lists,
    in_static_mode,
    is_static_value,
    master_grad_hook_due,
    paddle_auto_cast,
    paddle_decorate,
    place_device,
    place_kind,
    runs_eagerly,
    set_amp_state_dtype,
    static_amp_supported,
    tracer_amp_level,
    tracer_op_lists,
    watch_for_sot,
    xpu_generation,
)

__all__ = [
    "CUDA_ONLY_FLUID_OPS",
    "PADDLE_VERSION",
    "amp_state_dtype",
    "applying_method",
    "assign_grad",
    "bound_scheduler",
    "autocast_enabled",
    "default_op_lists",
    "first_parameter",
    "gpu_linear_is_fused",
    "grad_of",
    "hapi_scaler",
    "in_static_mode",
    "is_dist",
    "init_scaler_state",
    "is_static_value",
    "local_value",
    "mark_stepped",
    "master_grad_hook_due",
    "multiply_inplace",
    "o2_low_precision_layers",
    "op_of_api",
    "ops_in_default_amp_lists",
    "ops_paddle_defines",
    "ops_this_build_registers",
    "optimizer_parameters",
    "optimizer_wrapper_classes",
    "optimizer_stage",
    "paddle_auto_cast",
    "paddle_decorate",
    "paddle_scaler_view",
    "place_device",
    "place_kind",
    "replicated",
    "runs_eagerly",
    "reset_optimizer_stages",
    "scaler_scale_tensor",
    "set_amp_state_dtype",
    "set_found_flags",
    "set_scaler_enabled",
    "set_scaler_scale",
    "squared_l2_norm",
    "static_amp_supported",
    "tracer_amp_level",
    "tracer_op_lists",
    "xpu_generation",
    "watch_for_sot",
    "unscale",
]
