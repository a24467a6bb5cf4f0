"""Paddle's own AMP rules for the devices that are not NVIDIA CUDA GPUs: ROCm/DCU GPUs, Kunlun XPUs
and custom devices (Ascend NPU and others through PaddleCustomDevice).

Pure: no Paddle import. :func:`paddle_amp_ext.device.probe_accelerator` supplies the
:class:`Accelerator`; :func:`paddle_amp_ext.gate.decide` gives the verdict. The rules are the ones
``paddle.amp.auto_cast`` (``amp_guard``) and ``decorate`` apply, from reading
``python/paddle/amp/auto_cast.py`` of Paddle 2.6.2 and 3.3.1 (docs/gate.md quotes them):

- ROCm/DCU (a GPU place in a ROCm build). 3.x: ``_is_gpu_float16_supported`` and
  ``_is_gpu_bfloat16_supported`` end in ``or paddle.is_compiled_with_rocm()``: both on every ROCm
  device. 2.6: the same functions read only ``get_device_capability()``: float16 from major 7,
  bfloat16 from major 8 with ``paddle.version.cuda()`` 11 or later, which a ROCm build does not
  have (``'False'``): never bfloat16.
- Kunlun XPU. 3.x: ``_is_xpu_float16_supported`` (``get_xpu_device_version >= XPU2``) and
  ``_is_xpu_bfloat16_supported`` (``>= XPU3``). 2.6: ``amp_guard`` allows float16 on every XPU and
  refuses bfloat16 ("XPUPlace only support float16 amp.").
- Custom devices. 3.x: float16 on every one; bfloat16 where ``_is_custom_device_bfloat16_supported``
  names the device type: ``npu``, ``intel_hpu``, ``iluvatar_gpu``, ``metax_gpu``. 2.6: float16
  only ("CustomPlace only support float16 amp.").

Example:
    >>> paddle_support(Accelerator("xpu", xpu_generation=2), (3, 3, 1))[:2]
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

KINDS = ("rocm", "xpu", "custom")
#: Custom device types Paddle 3.x allows bfloat16 AMP on (``_is_custom_device_bfloat16_supported``, 3.3.1).
CUSTOM_BF16_TYPES = ("npu", "intel_hpu", "iluvatar_gpu", "metax_gpu")
_SOURCE = "python/paddle/amp/auto_cast.py"


@dataclass(frozen=True)
class Accelerator:
    """A ROCm GPU, Kunlun XPU or custom device as Paddle's AMP rules see it.

    Attributes:
        kind: ``"rocm"``, ``"xpu"`` or ``"custom"``.
        index: the device id.
        name: the device's name, for the reason sentence (optional).
        xpu_generation: an XPU's generation (1, 2 or 3: ``XPUVersion.XPU1``..``XPU3``).
        device_type: a custom device's type (``"npu"``, ``"mlu"``, ...).
        compute_capability: what ``get_device_capability()`` says on a ROCm GPU (Paddle 2.6 reads it).

    Example:
        >>> Accelerator("custom", device_type="npu").label
        'custom device npu:0'
    """

    kind: str
    index: int = 0
    name: str = ""
    xpu_generation: Optional[int] = None
    device_type: Optional[str] = None
    compute_capability: Optional[Tuple[int, int]] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}. Received: kind={self.kind!r}")
        if not _is_int(self.index) or self.index < 0:
            raise ValueError(f"index must be an int >= 0. Received: index={self.index!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str. Received: name={self.name!r} (of type {type(self.name).__name__})")
        if self.kind == "xpu" and (not _is_int(self.xpu_generation) or self.xpu_generation not in (1, 2, 3)):
            raise ValueError("an XPU needs xpu_generation 1, 2 or 3 (XPUVersion.XPU1..XPU3). "
                             f"Received: xpu_generation={self.xpu_generation!r}")
        if self.kind == "custom" and (not isinstance(self.device_type, str) or not self.device_type.strip()):
            raise ValueError("a custom device needs its device_type, e.g. 'npu'. "
                             f"Received: device_type={self.device_type!r}")
        cc = self.compute_capability
        if cc is not None:
            cc = tuple(cc)
            if len(cc) != 2 or not all(_is_int(v) and v >= 0 for v in cc):
                raise ValueError("compute_capability must be None or a (major, minor) pair of ints. "
                                 f"Received: compute_capability={self.compute_capability!r}")
            object.__setattr__(self, "compute_capability", cc)

    @property
    def label(self) -> str:
        """``"ROCm GPU 0 (MI250X)"``, ``"Kunlun XPU 0 (XPU2)"``, ``"custom device npu:0"``."""
        named = f" ({self.name})" if self.name else ""
        if self.kind == "rocm":
            return f"ROCm GPU {self.index}{named}"
        if self.kind == "xpu":
            return f"Kunlun XPU {self.index} (XPU{self.xpu_generation}{', ' + self.name if self.name else ''})"
        return f"custom device {self.device_type}:{self.index}{named}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "index": self.index, "name": self.name, "xpu_generation": self.xpu_generation,
                "device_type": self.device_type,
                "compute_capability": _cc_text(self.compute_capability)}


def paddle_support(device: Accelerator, paddle_version: Tuple[int, ...]) -> Tuple[bool, bool, str]:
    """Whether Paddle ``paddle_version`` runs float16 and bfloat16 AMP on ``device``, and the rule it applies.

    Returns:
        ``(float16, bfloat16, rule)``; ``rule`` names the Paddle function (or ``amp_guard`` check) and version.
    """
    if not isinstance(device, Accelerator):
        raise TypeError(f"device must be an Accelerator. Received: {device!r} (of type {type(device).__name__})")
    three = tuple(paddle_version[:1]) >= (3,)
    version = ".".join(str(v) for v in paddle_version[:3])
    if device.kind == "rocm":
        if three:
            return True, True, (f"Paddle {version} allows float16 and bfloat16 AMP on every ROCm build "
                                f"({_SOURCE}: _is_gpu_float16_supported, _is_gpu_bfloat16_supported)")
        cc = device.compute_capability
        fp16 = cc is not None and cc[0] >= 7
        seen = _cc_text(cc) or "unknown"
        return fp16, False, (f"Paddle {version} reads the compute capability ({seen}): float16 from 7.0, and "
                             f"bfloat16 needs CUDA 11, which a ROCm build does not have ({_SOURCE}: "
                             "_is_gpu_float16_supported, _is_gpu_bfloat16_supported)")
    if device.kind == "xpu":
        if three:
            return device.xpu_generation >= 2, device.xpu_generation >= 3, (
                f"Paddle {version}: float16 from XPU2, bfloat16 from XPU3 ({_SOURCE}: _is_xpu_float16_supported, "
                "_is_xpu_bfloat16_supported)")
        return True, False, f"Paddle {version}: amp_guard allows float16 on every XPU, bfloat16 on none ({_SOURCE})"
    if three:
        bf16 = device.device_type.strip().lower() in CUSTOM_BF16_TYPES
        return True, bf16, (f"Paddle {version}: float16 on every custom device, bfloat16 on "
                            f"{', '.join(CUSTOM_BF16_TYPES)} ({_SOURCE}: _is_custom_device_bfloat16_supported)")
    return True, False, (f"Paddle {version}: amp_guard allows float16 on every custom device, bfloat16 on none "
                         f"({_SOURCE})")


def _cc_text(cc: Optional[Tuple[int, int]]) -> Optional[str]:
    return None if cc is None else f"{cc[0]}.{cc[1]}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
