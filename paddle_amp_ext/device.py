"""GPU discovery through Paddle's public device API, and the process-wide AMP decision."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Optional, Tuple

import paddle

from . import _compat
from .gate import AmpDecision, DeviceInfo, decide, decide_by_support


@dataclass(frozen=True)
class ProbeReport:
    """What :func:`probe` found, and why there is no GPU when there is none."""

    paddle_version: str
    cuda_version: Optional[str]
    cudnn_version: Optional[str]
    devices: Tuple[DeviceInfo, ...] = ()
    reason: Optional[str] = None
    errors: Tuple[str, ...] = field(default=())


def _version_or_none(getter) -> Optional[str]:
    try:
        value = getter()
    except Exception:  # a probe must never raise
        return None
    if value in (None, False, "False", 0):
        return None
    return str(value)


def probe_report() -> ProbeReport:
    """Collect Paddle's build and GPU facts; never raises (failures land in ``errors``)."""
    cuda = _version_or_none(paddle.version.cuda)
    cudnn = _version_or_none(paddle.version.cudnn)
    base = ProbeReport(paddle_version=paddle.__version__, cuda_version=cuda, cudnn_version=cudnn)
    try:
        if not paddle.device.is_compiled_with_cuda():
            kinds = []
            if paddle.device.is_compiled_with_xpu():
                kinds.append("XPU")
            kinds += list(paddle.device.get_all_custom_device_type() or [])
            other = f" (this build targets {', '.join(kinds)})" if kinds else ""
            return replace(base, reason=f"Paddle is a CPU build without CUDA{other}")
        count = paddle.device.cuda.device_count()
    except Exception as exc:
        return replace(base, reason="could not collect GPU information", errors=(repr(exc),))
    if count == 0:
        return replace(
            base, reason="Paddle has CUDA but sees no GPU (driver, container --gpus, or CUDA_VISIBLE_DEVICES)"
        )
    devices, errors = [], []
    for index in range(count):
        try:
            props = paddle.device.cuda.get_device_properties(index)
            devices.append(
                DeviceInfo(
                    index=index,
                    name=str(props.name),
                    compute_capability=(int(props.major), int(props.minor)),
                    total_memory_bytes=int(props.total_memory),
                )
            )
        except Exception as exc:
            errors.append(f"gpu:{index}: {exc!r}")
    reason = None if devices else "could not collect GPU information"
    return replace(base, devices=tuple(devices), reason=reason, errors=tuple(errors))


def probe() -> list[DeviceInfo]:
    """The visible GPUs (empty on a CPU build, without a GPU, or on XPU/custom devices).

    Never raises: a device Paddle cannot describe is left out (``check`` reports why).

    Returns:
        One :class:`DeviceInfo` per visible CUDA GPU, in Paddle's order.

    Example:
        >>> probe()  # on a CPU machine
        []
    """
    return list(probe_report().devices)


def _current_index() -> int:
    device = str(paddle.device.get_device())
    if device.startswith("gpu:"):
        return int(device.split(":", 1)[1])
    return 0


def device_decision(kind: str, requested: str, strict: bool = False) -> AmpDecision:
    """The decision for an XPU or custom device: Paddle's own support check decides."""
    fp16 = bool(paddle.amp.is_float16_supported())
    bf16 = bool(paddle.amp.is_bfloat16_supported())
    return decide_by_support(requested, fp16=fp16, bf16=bf16, device=f"this {kind.upper()} device",
                             rule="paddle.amp.is_float16_supported/is_bfloat16_supported", strict=strict)


@functools.cache
def current_decision(requested: str = "auto", strict: bool = False) -> AmpDecision:
    """The gate's decision for the current GPU, made once per process and request."""
    if paddle.is_compiled_with_rocm():  # Paddle's own rule, not a CUDA compute capability
        fp16, bf16 = _compat.gpu_amp_support()
        return decide_by_support(requested, fp16=fp16, bf16=bf16, device=f"ROCm GPU {_current_index()}",
                                 rule=f"Paddle {paddle.__version__}'s rule for ROCm builds", strict=strict)
    report = probe_report()
    index = _current_index()
    device = next((d for d in report.devices if d.index == index), None)
    return decide(
        device,
        requested,
        strict=strict,
        cuda_version=report.cuda_version,
        no_device_reason=report.reason or "no CUDA GPU is visible",
    )
