"""The gate's public surface beyond CUDA with wrong types and odd text: Accelerator, decide,
paddle_support and check's --what-if parser name the bad value and what was expected."""

from __future__ import annotations

import pytest

from paddle_amp_ext.backends import Accelerator, paddle_support
from paddle_amp_ext.check import parse_what_if
from paddle_amp_ext.gate import DeviceInfo, decide


@pytest.mark.parametrize("kwargs, error, match", [
    ({"kind": "tpu"}, ValueError, r"kind must be one of \('rocm', 'xpu', 'custom'\)\. Received: kind='tpu'"),
    ({"kind": "XPU", "xpu_generation": 2}, ValueError, "kind must be one of"),
    ({"kind": "xpu"}, ValueError, r"an XPU needs xpu_generation 1, 2 or 3 .* Received: xpu_generation=None"),
    ({"kind": "xpu", "xpu_generation": 4}, ValueError, "Received: xpu_generation=4"),
    ({"kind": "xpu", "xpu_generation": True}, ValueError, "Received: xpu_generation=True"),
    ({"kind": "xpu", "xpu_generation": "2"}, ValueError, "Received: xpu_generation='2'"),
    ({"kind": "xpu", "xpu_generation": 2.0}, ValueError, r"Received: xpu_generation=2\.0"),
    ({"kind": "custom"}, ValueError, "a custom device needs its device_type"),
    ({"kind": "custom", "device_type": "   "}, ValueError, "Received: device_type='   '"),
    ({"kind": "custom", "device_type": b"npu"}, ValueError, "Received: device_type=b'npu'"),
    ({"kind": "rocm", "index": -1}, ValueError, "index must be an int >= 0. Received: index=-1"),
    ({"kind": "rocm", "index": True}, ValueError, "Received: index=True"),
    ({"kind": "rocm", "name": None}, TypeError, r"name must be a str\. Received: name=None \(of type NoneType\)"),
    ({"kind": "rocm", "compute_capability": (9,)}, ValueError, r"Received: compute_capability=\(9,\)"),
    ({"kind": "rocm", "compute_capability": (9, -1)}, ValueError, "compute_capability must be None or"),
    ({"kind": "rocm", "compute_capability": (9.0, 0)}, ValueError, "compute_capability must be None or"),
])
def test_accelerator_rejects_what_paddle_never_reports(kwargs, error, match):
    with pytest.raises(error, match=match):
        Accelerator(**kwargs)


def test_accelerator_is_frozen_and_normalises_its_pair():
    rocm = Accelerator("rocm", compute_capability=[9, 0])
    assert rocm.compute_capability == (9, 0) and rocm.label == "ROCm GPU 0"
    with pytest.raises(AttributeError):
        rocm.kind = "xpu"


@pytest.mark.parametrize("bad", ["xpu", 2, DeviceInfo(index=0, name="T4", compute_capability=(7, 5))])
def test_paddle_support_needs_an_accelerator(bad):
    with pytest.raises(TypeError, match="device must be an Accelerator. Received: "):
        paddle_support(bad, (3, 3, 1))


@pytest.mark.parametrize("bad", ["xpu:2", 7, object()])
def test_decide_names_a_device_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match=r"device must be a DeviceInfo, an Accelerator or None\. Received: "):
        decide(bad, "auto")


def test_decide_rejects_a_bad_request_before_looking_at_an_accelerator():
    with pytest.raises(ValueError, match=r"Received: requested='fp8'"):
        decide(Accelerator("xpu", xpu_generation=3), "fp8")
    assert decide(Accelerator("xpu", xpu_generation=1), "float32").reason == "float32 was requested: AMP is off."


@pytest.mark.parametrize("text, expected", [
    ("xpu:1", Accelerator("xpu", xpu_generation=1)),
    ("  XPU:xpu2 ", Accelerator("xpu", xpu_generation=2)),
    ("custom:Intel_HPU", Accelerator("custom", device_type="intel_hpu")),
    ("custom:metax-gpu", Accelerator("custom", device_type="metax-gpu")),
    ("rocm:", Accelerator("rocm")),
    ("rocm:AMD Instinct MI300X:9.4", Accelerator("rocm", name="AMD Instinct MI300X", compute_capability=(9, 4))),
    ("rocm:a:b:c", Accelerator("rocm", name="a:b:c")),
])
def test_what_if_parses_every_accelerator_form(text, expected):
    assert parse_what_if(text) == expected


@pytest.mark.parametrize("text, match", [
    ("xpu:4", r"xpu:GENERATION expects 1, 2 or 3"),
    ("xpu:", r"xpu:GENERATION expects 1, 2 or 3"),
    ("xpu:２", r"xpu:GENERATION expects 1, 2 or 3"),
    ("custom:", r"custom:TYPE expects a PaddleCustomDevice type"),
    ("custom:n p u", r"custom:TYPE expects"),
    ("custom:../npu", r"custom:TYPE expects"),
    ("", r"--what-if expects NAME:CC\[:MEM_GB\] \(a CUDA GPU"),
    ("tpu:v4", r"rocm:NAME\[:CC\].*xpu:GENERATION.*custom:TYPE"),
    (None, r"--what-if expects"),
])
def test_what_if_names_the_forms_it_accepts(text, match):
    with pytest.raises(ValueError, match=match):
        parse_what_if(text)
