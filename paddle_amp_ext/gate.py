"""The compute-capability gate: which precision a GPU should train in, and why.

Pure: no Paddle import. :func:`paddle_amp_ext.probe` supplies the :class:`DeviceInfo`. ROCm/DCU
GPUs, Kunlun XPUs and custom devices (:class:`~paddle_amp_ext.backends.Accelerator`) get the
verdict Paddle itself gives them (:mod:`paddle_amp_ext.backends`).

Rules (NVIDIA): float16 pays from compute capability 7.0 (Volta, Tensor Cores) and needs dynamic
loss scaling; bfloat16 needs 8.0 (Ampere) and CUDA 11, and needs no loss scaling. Below 7.0
(Kepler K80, Maxwell M60, Pascal P100) AMP is off: it can be slower than float32 there.

Example:
    >>> v100 = DeviceInfo(index=0, name="Tesla V100-SXM2-16GB", compute_capability=(7, 0),
    ...                   total_memory_bytes=16 * 2**30)
    >>> decide(v100).dtype
    'float16'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from ._log import warn_once
from .backends import Accelerator, paddle_support
from .errors import AmpUnsupportedError

FP16_MIN_CC = (7, 0)
BF16_MIN_CC = (8, 0)
BF16_MIN_CUDA = 11
REQUESTS = ("auto", "float16", "bfloat16", "float32")
#: The Paddle version whose rules :func:`decide` applies to an Accelerator unless told otherwise.
RULES_OF = (3, 3, 1)


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as the gate sees it.

    Example:
        >>> DeviceInfo(index=0, name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0),
        ...            total_memory_bytes=40 * 2**30).supports_bf16
        True
    """

    index: int
    name: str
    compute_capability: Tuple[int, int]
    total_memory_bytes: int = 0

    def __post_init__(self) -> None:
        cc = tuple(self.compute_capability)
        if len(cc) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc):
            raise ValueError(
                "compute_capability must be a (major, minor) pair of ints, e.g. (7, 5). "
                f"Received: compute_capability={self.compute_capability!r}"
            )
        object.__setattr__(self, "compute_capability", cc)

    @property
    def cc_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    @property
    def tensor_cores(self) -> bool:
        return self.compute_capability >= FP16_MIN_CC

    @property
    def supports_fp16(self) -> bool:
        return self.compute_capability >= FP16_MIN_CC

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= BF16_MIN_CC

    @property
    def total_memory_mb(self) -> int:
        return self.total_memory_bytes // 2**20


@dataclass(frozen=True)
class AmpDecision:
    """What AMP will do: ``dtype`` is ``float16``, ``bfloat16`` or ``float32`` (AMP off).

    Attributes:
        enabled: whether AMP runs (False: float32).
        dtype: ``"float16"``, ``"bfloat16"`` or ``"float32"``.
        use_loss_scaling: whether the GradScaler scales the loss (float16 only).
        reason: one sentence naming the device, its compute capability and the rule applied.
        requested: what was asked for (``"auto"``, ``"float16"``, ...).
        fallback: an explicit request fell back to float32.
    """

    enabled: bool
    dtype: str
    use_loss_scaling: bool
    reason: str
    requested: str = "auto"
    fallback: bool = False

    def to_dict(self) -> dict:
        """The decision for ``check --json``: ``enabled``, ``dtype``, ``use_loss_scaling``, ``reason``."""
        return {
            "enabled": self.enabled,
            "dtype": self.dtype,
            "use_loss_scaling": self.use_loss_scaling,
            "reason": self.reason,
        }


def _fp32(requested: str, reason: str, fallback: bool) -> AmpDecision:
    return AmpDecision(False, "float32", False, reason, requested, fallback)


def decide(
    device: Optional[Union[DeviceInfo, Accelerator]],
    requested: str = "auto",
    *,
    strict: bool = False,
    cuda_version: Optional[str] = None,
    no_device_reason: str = "no CUDA GPU is visible",
    paddle_version: Tuple[int, ...] = RULES_OF,
) -> AmpDecision:
    """Pick the training precision for ``device``.

    Args:
        device: the CUDA GPU; a ROCm GPU, XPU or custom device (an ``Accelerator``: Paddle
            ``paddle_version``'s own rule decides, see :mod:`paddle_amp_ext.backends`); or None
            when there is none.
        requested: ``"auto"`` (best the GPU can do), ``"float16"``, ``"bfloat16"`` or ``"float32"``.
        strict: raise instead of falling back when an explicit ``float16``/``bfloat16`` request
            cannot run (``"auto"`` never raises: float32 is its answer where AMP does not pay).
        cuda_version: Paddle's CUDA version (``"11.8"``); bfloat16 needs 11 or later.
        no_device_reason: why there is no device, for the reason sentence.
        paddle_version: the Paddle whose rules apply to an ``Accelerator`` (default 3.3.1's).

    Returns:
        AmpDecision with a reason naming the device, its compute capability (or generation, or
        type) and the rule applied.

    Raises:
        ValueError: ``requested`` is not one of ``auto``, ``float16``, ``bfloat16``, ``float32``.
        AmpUnsupportedError: with ``strict=True``, the request cannot run on this device.
    """
    if not isinstance(requested, str) or requested.lower() not in REQUESTS:
        raise ValueError(f"requested must be one of {REQUESTS}. Received: requested={requested!r}")
    requested = requested.lower()
    if requested == "float32":
        return _fp32(requested, "float32 was requested: AMP is off.", False)
    if isinstance(device, Accelerator):
        fp16, bf16, rule = paddle_support(device, paddle_version)
        return decide_by_support(requested, fp16=fp16, bf16=bf16, device=device.label, rule=rule, strict=strict)
    if device is not None and not isinstance(device, DeviceInfo):
        raise TypeError(f"device must be a DeviceInfo, an Accelerator or None. Received: {device!r} "
                        f"(of type {type(device).__name__})")
    if device is None:
        reason = f"AMP is off and training runs in float32: {no_device_reason}."
        return _unsupported(requested, reason, strict, explicit=requested != "auto")
    gpu = f"{device.name} (compute capability {device.cc_text})"
    cuda_major = _major(cuda_version)
    bf16_ok = device.supports_bf16 and (cuda_major is None or cuda_major >= BF16_MIN_CUDA)
    if not device.supports_fp16:
        reason = (
            f"{gpu} is below compute capability 7.0: it has no Tensor Cores, so float16 AMP "
            f"would not be faster and may be slower; training runs in float32."
        )
        return _unsupported(requested, reason, strict, explicit=requested != "auto")
    if requested == "bfloat16" and not bf16_ok:
        need = "compute capability 8.0" if not device.supports_bf16 else f"CUDA 11 (found {cuda_version})"
        reason = f"bfloat16 needs {need}; {gpu} cannot run it, so training runs in float32."
        return _unsupported(requested, reason, strict, explicit=True)
    if requested == "bfloat16" or (requested == "auto" and bf16_ok):
        reason = (
            f"{gpu} supports bfloat16 (compute capability >= 8.0): bfloat16 has float32's range, "
            "so no loss scaling is needed."
        )
        return AmpDecision(True, "bfloat16", False, reason, requested)
    why = "requested" if requested == "float16" else "the best this GPU supports"
    reason = (
        f"{gpu} has Tensor Cores (compute capability >= 7.0): float16 ({why}) with dynamic "
        "loss scaling."
    )
    return AmpDecision(True, "float16", True, reason, requested)


def decide_by_support(
    requested: str,
    *,
    fp16: bool,
    bf16: bool,
    device: str,
    rule: str,
    strict: bool = False,
) -> AmpDecision:
    """Pick the precision where Paddle's own support check decides, not a CUDA compute capability.

    Used for ROCm GPUs (Paddle 3.x allows float16 and bfloat16 AMP on every ROCm device), XPUs
    and custom devices (Paddle's ``is_float16_supported``/``is_bfloat16_supported``).

    Args:
        requested: ``"auto"``, ``"float16"``, ``"bfloat16"`` or ``"float32"``.
        fp16, bf16: Paddle's answers for this device.
        device: the device, for the reason sentence (``"ROCm GPU 0"``).
        rule: the rule Paddle applied, for the reason sentence.
        strict: raise instead of falling back when an explicit request cannot run.

    Example:
        >>> decide_by_support("auto", fp16=True, bf16=False, device="XPU 0", rule="Paddle's XPU check").dtype
        'float16'
    """
    if not isinstance(requested, str) or requested.lower() not in REQUESTS:
        raise ValueError(f"requested must be one of {REQUESTS}. Received: requested={requested!r}")
    requested = requested.lower()
    if requested == "float32":
        return _fp32(requested, "float32 was requested: AMP is off.", False)
    if requested == "bfloat16" or (requested == "auto" and bf16):
        if bf16:
            return AmpDecision(True, "bfloat16", False, f"{device} supports bfloat16 AMP ({rule}): "
                               "bfloat16 has float32's range, so no loss scaling is needed.", requested)
        return _unsupported(requested, f"{device} does not support bfloat16 AMP ({rule}), so training runs in "
                            "float32.", strict, explicit=True)
    if fp16:
        return AmpDecision(True, "float16", True, f"{device} supports float16 AMP ({rule}): float16 with dynamic "
                           "loss scaling.", requested)
    reason = f"{device} supports neither float16 nor bfloat16 AMP ({rule}), so training runs in float32."
    return _unsupported(requested, reason, strict, explicit=requested != "auto")


def _unsupported(requested: str, reason: str, strict: bool, explicit: bool) -> AmpDecision:
    if explicit and strict:
        raise AmpUnsupportedError(f"{requested} AMP requested, but {reason}")
    if explicit:
        warn_once(f"gate:{requested}:{reason}", "%s AMP requested but not usable: %s", requested, reason)
    return _fp32(requested, reason, fallback=explicit)


def _major(version: Optional[str]) -> Optional[int]:
    if not version or version == "False":
        return None
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None
