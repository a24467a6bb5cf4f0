"""Which op types Paddle defines (for any backend) and which this build registers.

A CPU wheel's op registry (``core.get_all_op_names()``, its phi kernels) lacks every op whose
kernels exist only for GPUs or XPUs (``sync_batch_norm``, ``fused_gemm_epilogue``,
``fused_attention``, ...), yet configs written for GPUs list them (PaddleSeg 2.8.0 hard-codes
``custom_white_list={"elementwise_add", "batch_norm", "sync_batch_norm"}``). Custom op lists are
therefore validated against what Paddle *defines*, read from what every wheel ships whatever its
backend (checked against paddlepaddle 2.6.2 and 3.3.1, CPU builds).

Three sets, each named for what it holds: :func:`ops_this_build_registers`,
:func:`ops_in_default_amp_lists`, :func:`ops_paddle_defines` (the union of the two and more).
Relies on:

- ``paddle.base.core.get_all_op_names()`` and ``core._get_registered_phi_kernels('all')``: the
  ops and kernels registered in this build (what can run here); Paddle's default AMP lists
  (``paddle.amp.amp_lists``, through :func:`.tracer.default_op_lists`), which name GPU-only ops
  too (``fused_gemm_epilogue``).
- ``paddle.incubate.autograd.phi_ops_map.op_map``: generated at Paddle's build from its op
  YAML (``op_compat.yaml``), the same on every backend: legacy op names as keys, ``phi_name`` in
  each value. Has ``sync_batch_norm``, ``fused_gemm_epilogue``, ``fused_attention``,
  ``fused_feedforward``, ``fused_bn_add_activation``, ``fused_batch_norm_act`` on both versions.
- the public functions of ``paddle._C_ops`` and ``paddle._legacy_C_ops``: the eager API
  generated for every op of Paddle's YAML whatever the backend (inplace variants end in ``_``,
  stripped here), e.g. ``sync_batch_norm_``; 3.3.1 also has ``fused_gemm_epilogue`` there.
- :data:`CUDA_ONLY_FLUID_OPS`: legacy (fluid) ops that Paddle compiles only into CUDA builds
  (``USE_CUDA_ONLY_OP`` in ``paddle/fluid/operators/fused/CMakeLists.txt``, from reading
  Paddle's code), so that a CPU wheel carries no trace of them (2.6.2: ``fused_multi_transformer``,
  ``resnet_unit``, ``fusion_group``). Used only to accept these names; never to claim a kernel.
- :data:`FUSED_API_OPS`: the op each fused API of ``paddle.incubate.nn.functional`` whose name
  is no op runs (``fused_layer_norm`` runs ``fused_bias_residual_layernorm``), from their code;
  used only to say so when a list names the API.

Not used: neither wheel ships Paddle's op YAML; ``core.get_all_op_protos()`` (``OpProtoHolder``)
and ``core._get_all_register_op_kernels()`` hold this build's ops only; ``core.op_support_gpu``
answers True for any name and ``core.get_op_attrs_default_value`` ``{}`` for an unknown one; the
C++ headers under ``paddle/include`` (``phi/api/include/api.h``) name GPU ops but are headers.
"""

from __future__ import annotations

import functools
from typing import Any

from .tracer import default_op_lists

#: Fluid ops registered only in CUDA builds of Paddle (from reading Paddle's CMake files).
CUDA_ONLY_FLUID_OPS: frozenset[str] = frozenset({
    "conv2d_fusion",
    "conv2d_inception_fusion",
    "fused_batch_norm_act",
    "fused_bn_activation",
    "fused_bn_add_activation",
    "fused_fc_elementwise_layernorm",
    "fused_multi_transformer",
    "fusion_group",
    "fusion_transpose_flatten_concat",
    "multihead_matmul",
    "resnet_unit",
    "skip_layernorm",
})


@functools.cache
def ops_this_build_registers() -> frozenset[str]:
    """The op types this build of Paddle registers (its op definitions and phi kernels).

    Returns:
        What an op can run as here; on a CPU wheel, no GPU-only op.
    """
    from paddle.base import core

    names: set[str] = set(core.get_all_op_names())
    try:
        names.update(core._get_registered_phi_kernels("all"))
    except (AttributeError, TypeError, RuntimeError):  # pragma: no cover - older builds
        pass
    return frozenset(names)


@functools.cache
def ops_in_default_amp_lists() -> frozenset[str]:
    """The op types Paddle's default AMP white and black lists name (float16 and bfloat16, O1 and
    O2), GPU-only ones included (``fused_gemm_epilogue``)."""
    names: set[str] = set()
    for dtype in ("float16", "bfloat16"):
        for level in ("O1", "O2"):
            white, black = default_op_lists(dtype, level)
            names.update(white)
            names.update(black)
    return frozenset(names)


def _eager_api_names(module: Any) -> set[str]:
    """The op functions of a generated eager-op module, inplace ``_`` suffixes stripped."""
    names: set[str] = set()
    if module is None:
        return names
    for name in dir(module):
        if name.startswith("_") or name.startswith("get_core_ops"):
            continue
        if not callable(getattr(module, name, None)):
            continue
        names.add(name[:-1] if name.endswith("_") else name)
    return names


def _op_compat_names() -> set[str]:
    try:
        from paddle.incubate.autograd.phi_ops_map import op_map
    except ImportError:  # pragma: no cover - both checked versions have it
        return set()
    names: set[str] = set()
    for legacy, entry in op_map.items():
        names.add(legacy)
        phi_name = entry.get("phi_name") if isinstance(entry, dict) else None
        if isinstance(phi_name, str):
            names.add(phi_name)
    return {n[:-1] if n.endswith("_") else n for n in names} | names


@functools.cache
def ops_paddle_defines() -> frozenset[str]:
    """Every op type Paddle defines for any backend (GPU-only, XPU-only and fused ops included).

    Returns:
        :func:`ops_this_build_registers` and :func:`ops_in_default_amp_lists`, plus the ops of
        Paddle's op definitions that this build has no kernel for.
    """
    import paddle

    names = set(ops_this_build_registers()) | ops_in_default_amp_lists()
    names.update(_op_compat_names())
    names.update(_eager_api_names(getattr(paddle, "_C_ops", None)))
    names.update(_eager_api_names(getattr(paddle, "_legacy_C_ops", None)))
    names.update(CUDA_ONLY_FLUID_OPS)
    return frozenset(names)


#: ``paddle.incubate.nn.functional`` APIs whose name is no op type -> the op each runs, first the
#: one of the newest version (from reading their code on 2.6.2 and 3.3.1; tests read it again).
FUSED_API_OPS: dict[str, tuple[str, ...]] = {
    "fused_layer_norm": ("fused_bias_residual_layernorm",),
    "fused_rms_norm": ("fused_rms_norm_quant", "rms_norm"),  # 3.3.1, 2.6.2
    "fused_linear": ("fused_gemm_epilogue",),
    "fused_matmul_bias": ("fused_gemm_epilogue",),
    "fused_linear_activation": ("fused_gemm_epilogue",),
    "fused_multi_head_attention": ("fused_attention",),
    "fused_ec_moe": ("moe",),  # 2.6.2
    "cudnn_flash_attention": ("fused_dot_product_attention",),  # 3.3.1
}


def op_of_api(name: str) -> str | None:
    """The op type a ``paddle.incubate.nn.functional`` API named ``name`` runs on this version, or
    None (not such an API, or its op is not defined here)."""
    defined = ops_paddle_defines()
    return next((op for op in FUSED_API_OPS.get(name, ()) if op in defined), None)
