"""Paddle internals that ``check --verify`` reads: op-dtype statistics and the unscale kernel.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1, CPU builds; the GPU wheels share the
Python code): ``paddle.base.core.clear_low_precision_op_list`` / ``get_low_precision_op_list`` and
the flag ``FLAGS_low_precision_op_list``, which the public
``paddle.amp.debugging.enable_operator_stats_collection`` / ``disable_...`` use (the public
``disable`` prints the table and returns nothing, so the dict is read here); each value is
``"fp16,bf16,fp32,other"`` call counts of the forward ops (backward ops are not counted, on
either version). ``_legacy_C_ops.check_finite_and_unscale(xs, scale, xs, found_inf)``, the kernel
``paddle.amp.GradScaler._unscale`` launches: on a CPU build registered for float32 and float64
only (float16/bfloat16 raise ``NotFound``), and zeroing every tensor from the first non-finite
one on (``paddle/phi/kernels/cpu/amp_kernel.cc``); the CUDA kernel scales all of them.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List

import paddle
from paddle import _legacy_C_ops


@contextlib.contextmanager
def op_stats() -> Iterator[Dict[str, str]]:
    """Count the ops run in the block by dtype; the dict is filled as the block ends.

    Yields:
        ``{op: "fp16,bf16,fp32,other"}``, empty until the block ends.
    """
    core = paddle.base.core
    counted: Dict[str, str] = {}
    core.clear_low_precision_op_list()
    paddle.set_flags({"FLAGS_low_precision_op_list": 1})
    try:
        yield counted
        counted.update(core.get_low_precision_op_list())
    finally:
        paddle.set_flags({"FLAGS_low_precision_op_list": 0})
        core.clear_low_precision_op_list()


def check_finite_and_unscale(tensors: List[paddle.Tensor], scale: paddle.Tensor) -> paddle.Tensor:
    """Paddle's ``check_finite_and_unscale`` kernel on ``tensors`` (changed in place); found_inf.

    Raises:
        RuntimeError: the kernel is not registered for their dtype on this place (float16 and
            bfloat16 on a CPU).
    """
    found = paddle.to_tensor([False], place=tensors[0].place) if tensors else paddle.to_tensor([False])
    _legacy_C_ops.check_finite_and_unscale(tensors, scale, tensors, found)
    return found
