"""How Paddle's layers reach their kernels on a GPU, for the rehearsal to follow.

Relies on (read in, and checked against, paddlepaddle 2.6.2 and 3.3.1):

- ``paddle.nn.functional.conv._conv_nd(x, weight, bias, stride, padding, padding_algorithm,
  dilation, groups, data_format, channel_dim, op_type, ...)``: what ``nn.Conv2D``/``nn.Conv3D``
  call (looked up on the module at call time, as are ``F.conv2d``'s and ``F.conv3d``'s calls of
  it); it runs the ``op_type`` kernel, then adds the bias reshaped to ``channel_dim`` as a
  separate ``add``.
- ``F.linear`` on a CUDA build: on 3.3.1 one ``_C_ops.linear_v2`` (a white-listed op, the
  bias included) unless ``FLAGS_use_legacy_linear``; on 2.6.2 ``_C_ops.linear``, which runs
  ``matmul`` and then ``add`` each under its own AMP rule (Paddle's ``eager_api_linear``).
- ``paddle.amp.auto_cast.set_excluded_layers`` and ``need_keep_fp32``: which layers'
  parameters ``decorate(level="O2")`` casts (not the norms, not the excluded layers; the flag
  is ``_cast_to_low_precision`` on 3.x, ``_cast_to_low_precison`` on 2.6).
"""

from __future__ import annotations

import functools
from typing import Any, List, Tuple

import paddle

from .tracer import _auto_cast_module

#: (module, attribute) of the private Python entry points the rehearsal wraps.
PRIVATE_ENTRY_POINTS: Tuple[Tuple[str, str], ...] = (("paddle.nn.functional.conv", "_conv_nd"),)


@functools.cache
def gpu_linear_is_fused() -> bool:
    """Whether ``F.linear`` runs as one ``linear_v2`` op on a GPU with this Paddle (3.3.1 unless
    ``FLAGS_use_legacy_linear``), rather than ``matmul`` then ``add`` (2.6.2)."""
    from paddle import _C_ops

    if not hasattr(_C_ops, "linear_v2"):
        return False
    try:
        legacy = paddle.get_flags("FLAGS_use_legacy_linear")["FLAGS_use_legacy_linear"]
    except (ValueError, KeyError):  # a Paddle without the flag
        legacy = False
    return not legacy


def o2_low_precision_layers(models: List[paddle.nn.Layer], dtype: str, excluded: Any) -> List[paddle.nn.Layer]:
    """The layers whose parameters ``decorate(models, level="O2", dtype=dtype,
    excluded_layers=excluded)`` casts to ``dtype`` (marking the excluded ones, as Paddle's
    decorate does)."""
    module = _auto_cast_module()
    module.set_excluded_layers(models, excluded)
    return [layer for model in models for layer in model.sublayers(include_self=True)
            if not module.need_keep_fp32(layer, dtype)]
