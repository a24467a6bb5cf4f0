"""GPU discovery through Paddle's public device API, and the process-wide AMP decision.

A ROCm GPU, Kunlun XPU or custom device is described by :func:`probe_accelerator` and judged by
Paddle's own rule for it (:mod:`paddle_amp_ext.backends`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Optional, Tuple

import paddle

from . import _compat
from .backends import Accelerator
from .gate import AmpDecision, DeviceInfo, decide


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


def probe_accelerator(kind: Optional[str] = None) -> Optional[Accelerator]:
    """The device Paddle runs on now when it is a ROCm GPU, a Kunlun XPU or a custom device, else None.

    Args:
        kind: the place kind (``"gpu"``, ``"xpu"``, ``"custom"``, ``"cpu"``); default: the tracer's.

    Raises:
        RuntimeError: Paddle could not describe the device (the message says which call failed).
    """
    kind = _compat.place_kind() if kind is None else kind
    try:
        if kind == "xpu":
            index, _ = _compat.place_device()
            return Accelerator("xpu", index=index, xpu_generation=_compat.xpu_generation(index))
        if kind == "custom":
            index, device_type = _compat.place_device()
            return Accelerator("custom", index=index, device_type=device_type)
        if paddle.is_compiled_with_rocm() and paddle.device.cuda.device_count() > 0:
            index = _current_index()
            major, minor = paddle.device.cuda.get_device_capability(index)
            return Accelerator("rocm", index=index, name=str(paddle.device.cuda.get_device_name(index)),
                               compute_capability=(int(major), int(minor)))
    except (RuntimeError, ValueError, TypeError, AttributeError, OSError) as exc:
        raise RuntimeError(f"Paddle could not describe its {kind} device: {exc!r}") from exc
    return None


def device_decision(kind: str, requested: str, strict: bool = False) -> AmpDecision:
    """The decision for an XPU or custom device: Paddle's own rule for it (:mod:`paddle_amp_ext.backends`)."""
    return decide(probe_accelerator(kind), requested, strict=strict, paddle_version=_compat.PADDLE_VERSION,
                  no_device_reason=f"Paddle describes no {kind} device here")


@functools.cache
def current_decision(requested: str = "auto", strict: bool = False) -> AmpDecision:
    """The gate's decision for the current device, made once per process and request (an XPU or
    custom device: Paddle's own rule, as :func:`device_decision`)."""
    kind = _compat.place_kind()
    if kind in ("xpu", "custom"):
        return device_decision(kind, requested, strict)
    if paddle.is_compiled_with_rocm():  # Paddle's own rule, not a CUDA compute capability
        return decide(probe_accelerator("gpu"), requested, strict=strict, paddle_version=_compat.PADDLE_VERSION,
                      no_device_reason="Paddle is a ROCm build but sees no GPU")
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
