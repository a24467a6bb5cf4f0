"""``check --what-if``: a device that is not present, parsed from its text form."""

from __future__ import annotations

import re
from typing import Union

from ..backends import Accelerator
from ..gate import DeviceInfo

_WHAT_IF = re.compile(r"^(?P<name>.+?):(?P<cc>\d+)\.(?P<minor>\d)(?::(?P<mem>\d+(?:\.\d+)?))?$")
_ACCELERATOR = re.compile(r"^(?P<kind>rocm|xpu|custom):(?P<rest>.*)$", re.IGNORECASE)
_ROCM = re.compile(r"^(?P<name>.*?)(?::(?P<cc>\d+)\.(?P<minor>\d+))?$")
WHAT_IF_FORMS = ("NAME:CC[:MEM_GB] (a CUDA GPU, e.g. 'Tesla T4:7.5:16'), rocm:NAME[:CC] (e.g. 'rocm:MI250X:9.0'), "
                 "xpu:GENERATION (1, 2 or 3, e.g. 'xpu:2') or custom:TYPE (e.g. 'custom:npu')")


def parse_what_if(text: str) -> Union[DeviceInfo, Accelerator]:
    """A device that is not present, from one of :data:`WHAT_IF_FORMS`: ``"Tesla T4:7.5:16"`` (a CUDA
    GPU), ``"rocm:MI250X:9.0"``, ``"xpu:2"`` or ``"custom:npu"`` (Paddle's own rule decides those).

    Raises:
        ValueError: the text has none of these forms.
    """
    if not isinstance(text, str):
        raise ValueError(f"--what-if expects {WHAT_IF_FORMS}. Received: {text!r}")
    accelerator = _ACCELERATOR.match(text.strip())
    if accelerator:
        return _parse_accelerator(accelerator["kind"].lower(), accelerator["rest"].strip(), text)
    match = _WHAT_IF.match(text.strip())
    if not match:
        raise ValueError(f"--what-if expects {WHAT_IF_FORMS}. Received: {text!r}")
    memory = float(match["mem"]) if match["mem"] else 0.0
    return DeviceInfo(
        index=0,
        name=match["name"],
        compute_capability=(int(match["cc"]), int(match["minor"])),
        total_memory_bytes=int(memory * 2**30),
    )


def _parse_accelerator(kind: str, rest: str, text: str) -> Accelerator:
    if kind == "xpu":
        generation = re.fullmatch(r"(?:xpu)?([123])", rest, re.IGNORECASE)
        if generation:
            return Accelerator("xpu", xpu_generation=int(generation.group(1)))
        raise ValueError(f"--what-if xpu:GENERATION expects 1, 2 or 3 (XPU1..XPU3). Received: {text!r}")
    if kind == "custom":
        if re.fullmatch(r"[A-Za-z][\w-]*", rest):
            return Accelerator("custom", device_type=rest.lower())
        raise ValueError(f"--what-if custom:TYPE expects a PaddleCustomDevice type, e.g. 'custom:npu'. "
                         f"Received: {text!r}")
    rocm = _ROCM.match(rest)
    cc = (int(rocm["cc"]), int(rocm["minor"])) if rocm["cc"] else None
    return Accelerator("rocm", name=rocm["name"].strip(), compute_capability=cc)
