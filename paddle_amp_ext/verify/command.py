"""``check --verify`` from the command line's point of view: find the GPU, load ``--model``, run.

Without a CUDA GPU nothing runs on a device: the report lists what would be checked and why it
was not (``--model`` is still loaded and run once in float32, so a bad one is reported here).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import paddle

from ..device import _current_index, probe_report
from ..gate import DeviceInfo
from . import pipeline
from .models import OVERFLOWING_LINEAR, ModelCase, load, try_forward
from .report import VerifyReport


def find_gpu() -> Tuple[Optional[DeviceInfo], Optional[str]]:
    """The current CUDA GPU, or None and why there is none."""
    if not paddle.device.is_compiled_with_cuda():
        return None, "Paddle is a CPU build (install paddlepaddle-gpu, see docs/install.md)"
    report = probe_report()
    device = next((d for d in report.devices if d.index == _current_index()), None)
    if device is None:
        return None, report.reason or "no CUDA GPU is visible (a container started without --gpus?)"
    return device, None


def dtypes_of(device: DeviceInfo) -> Tuple[str, ...]:
    """The low-precision dtypes the gate allows on ``device``."""
    return tuple(name for name, ok in (("float16", device.supports_fp16), ("bfloat16", device.supports_bf16)) if ok)


def verify(model: Optional[str] = None, runner: Any = None,
           gpu: Optional[Tuple[Optional[DeviceInfo], Optional[str]]] = None) -> VerifyReport:
    """Run ``--verify``: every check on the current GPU, or, without one, the plan.

    Args:
        model: ``"module:factory"`` for the user's model, or None.
        runner: the device runner (default :class:`.gpu_checks.DeviceRunner`).
        gpu: ``(device, reason)`` as :func:`find_gpu` returns it (default: found here).

    Returns:
        The report; syncs the device many times.

    Raises:
        ModelError: ``model`` cannot be loaded, built or run once in float32 (before any check).
    """
    device, reason = find_gpu() if gpu is None else gpu
    user: Optional[ModelCase] = None
    if model is not None:
        user = load(model)
        try_forward(user)
    if device is None:
        return VerifyReport(paddle_version=paddle.__version__, device=None, needs_gpu=reason,
                            plan=pipeline.plan((), model), model=model)
    if runner is None:
        from .gpu_checks import DeviceRunner

        runner = DeviceRunner()
    return pipeline.run(runner, device=f"[{device.index}] {device.name} (CC {device.cc_text})",
                        paddle_version=paddle.__version__, dtypes=dtypes_of(device), user=user,
                        rehearsal_cases=(OVERFLOWING_LINEAR,))
