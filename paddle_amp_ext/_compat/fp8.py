"""Paddle internals the FP8 emulation patches (:mod:`paddle_amp_ext.fp8.emulation`).

Relies on ``paddle._C_ops.swiglu_grad(x, y, dout) -> (dx, dy)``, which PaddleFormers 1.2.0's
``fp8_utils.py`` calls in ``common_fp8_mlp_bwd`` and whose CPU kernel has no bfloat16
(paddlepaddle 3.3.1, checked on a CPU; absent on 2.6.2, where FP8 is refused anyway).
"""

from __future__ import annotations

from typing import Tuple

import paddle


def swiglu_grad_slot() -> Tuple[object, str]:
    """Where ``swiglu_grad`` lives, as (owner, attribute) for a patch."""
    return paddle._C_ops, "swiglu_grad"
