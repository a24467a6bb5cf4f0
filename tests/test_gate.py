"""The compute-capability gate: the decision table, strict mode, and the process-wide decision."""

from __future__ import annotations

import logging

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import AmpUnsupportedError, DeviceInfo, decide

GPUS = {
    "K80": DeviceInfo(index=0, name="Tesla K80", compute_capability=(3, 7), total_memory_bytes=12 * 2**30),
    "M60": DeviceInfo(index=0, name="Tesla M60", compute_capability=(5, 2), total_memory_bytes=8 * 2**30),
    "P100": DeviceInfo(index=0, name="Tesla P100-PCIE-16GB", compute_capability=(6, 0)),
    "V100": DeviceInfo(index=0, name="Tesla V100-SXM2-16GB", compute_capability=(7, 0), total_memory_bytes=16 * 2**30),
    "T4": DeviceInfo(index=0, name="Tesla T4", compute_capability=(7, 5)),
    "A100": DeviceInfo(index=0, name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0)),
    "4090": DeviceInfo(index=0, name="NVIDIA GeForce RTX 4090", compute_capability=(8, 9)),
    "H100": DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0)),
    "none": None,
}
OFF = ("float32", False)
FP16 = ("float16", True)
BF16 = ("bfloat16", False)
# (dtype, use_loss_scaling) for requests auto, float16, bfloat16 (non-strict)
TABLE = {
    "K80": (OFF, OFF, OFF),
    "M60": (OFF, OFF, OFF),
    "P100": (OFF, OFF, OFF),
    "V100": (FP16, FP16, OFF),
    "T4": (FP16, FP16, OFF),
    "A100": (BF16, FP16, BF16),
    "4090": (BF16, FP16, BF16),
    "H100": (BF16, FP16, BF16),
    "none": (OFF, OFF, OFF),
}
REQUESTS = ("auto", "float16", "bfloat16")


@pytest.mark.parametrize("gpu", list(TABLE))
@pytest.mark.parametrize("column", range(3))
def test_decision_table(gpu, column):
    decision = decide(GPUS[gpu], REQUESTS[column])
    dtype, scaling = TABLE[gpu][column]
    assert (decision.dtype, decision.use_loss_scaling, decision.enabled) == (dtype, scaling, dtype != "float32")
    if GPUS[gpu] is not None:
        assert GPUS[gpu].name in decision.reason and GPUS[gpu].cc_text in decision.reason
    else:
        assert "no CUDA GPU" in decision.reason


@pytest.mark.parametrize("gpu", list(TABLE))
@pytest.mark.parametrize("column", range(3))
def test_strict_raises_exactly_where_an_explicit_request_falls_back(gpu, column):
    request = REQUESTS[column]
    expected = TABLE[gpu][column]
    if request != "auto" and expected == OFF:
        with pytest.raises(AmpUnsupportedError, match=f"{request} AMP requested") as info:
            decide(GPUS[gpu], request, strict=True)
        if GPUS[gpu] is not None:
            assert GPUS[gpu].cc_text in str(info.value)
    else:
        assert decide(GPUS[gpu], request, strict=True).dtype == expected[0]


def test_messages_name_found_and_required_capability():
    with pytest.raises(AmpUnsupportedError, match=r"Tesla K80 \(compute capability 3\.7\) is below compute capability 7\.0"):
        decide(GPUS["K80"], "float16", strict=True)
    with pytest.raises(AmpUnsupportedError, match=r"bfloat16 needs compute capability 8\.0; Tesla T4 \(compute capability 7\.5\)"):
        decide(GPUS["T4"], "bfloat16", strict=True)


def test_bf16_needs_cuda_11():
    decision = decide(GPUS["A100"], "auto", cuda_version="10.2")
    assert decision.dtype == "float16"
    assert decide(GPUS["A100"], "bfloat16", cuda_version="10.2").dtype == "float32"
    assert decide(GPUS["A100"], "auto", cuda_version="11.8").dtype == "bfloat16"


def test_fallback_warns_once(caplog):
    caplog.set_level(logging.WARNING, logger="paddle_amp_ext")
    for _ in range(3):
        decide(GPUS["K80"], "float16")
    warnings = [r for r in caplog.records if "float16 AMP requested but not usable" in r.getMessage()]
    assert len(warnings) == 1
    decide(GPUS["K80"], "auto")
    assert len(caplog.records) == 1, "auto falling back to float32 is not a warning from decide()"


def test_float32_request_and_bad_request():
    assert decide(GPUS["H100"], "float32").enabled is False
    with pytest.raises(ValueError, match=r"requested must be one of .*Received: requested='fp8'"):
        decide(GPUS["H100"], "fp8")


def test_device_info_is_constructible_by_keyword_and_validated():
    info = DeviceInfo(index=0, name="Tesla V100-SXM2-16GB", compute_capability=(7, 0), total_memory_bytes=16 * 2**30)
    assert (info.tensor_cores, info.supports_fp16, info.supports_bf16, info.total_memory_mb) == (True, True, False, 16384)
    with pytest.raises(ValueError, match=r"compute_capability must be a \(major, minor\) pair"):
        DeviceInfo(index=0, name="x", compute_capability=(7,))


def test_probe_on_this_machine_never_raises_and_says_why():
    from paddle_amp_ext.device import probe_report

    report = probe_report()
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU: tests/gpu covers it")
    assert amp.probe() == []
    if paddle.device.is_compiled_with_cuda():
        assert report.reason == "Paddle has CUDA but sees no GPU (driver, container --gpus, or CUDA_VISIBLE_DEVICES)"
    else:
        assert report.reason.startswith("Paddle is a CPU build without CUDA")


def test_auto_decision_drives_auto_cast_and_scaler_on_cpu(caplog_amp):
    """On a CPU build the reason says "CPU build"; on a GPU build that sees no GPU (a container
    started without --gpus) it says so instead: either way the probe's own reason is logged."""
    from paddle_amp_ext.device import probe_report

    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU: tests/gpu covers it")
    reason = probe_report().reason
    expected = "CPU build" if not paddle.device.is_compiled_with_cuda() else "Paddle has CUDA but sees no GPU"
    assert expected in reason
    scaler = amp.GradScaler(enable="auto")
    assert scaler.is_enable() is False
    with amp.auto_cast(dtype="auto"):
        from paddle_amp_ext import _compat

        assert _compat.tracer_amp_level() == "O0"
    auto_reasons = [r for r in caplog_amp.records if r.getMessage().startswith("auto_cast(dtype='auto'): AMP is off")]
    assert len(auto_reasons) == 1 and reason in auto_reasons[0].getMessage()
    for _ in range(3):
        amp.GradScaler()
    cpu_warnings = [r for r in caplog_amp.records if "loss scaling is off because Paddle runs on the CPU" in r.getMessage()]
    assert len(cpu_warnings) == 1, "one warning per process, not one per construction"


def test_strict_auto_cast_raises_on_cpu():
    with pytest.raises(AmpUnsupportedError, match="float16 AMP requested"):
        with amp.auto_cast(dtype="float16", strict=True):
            pass


def test_a_gpu_build_that_sees_no_gpu_says_so_not_cpu_build(monkeypatch, caplog_amp):
    """A GPU build of Paddle in a container started without --gpus, simulated through the probe's seams."""
    from paddle_amp_ext import device

    monkeypatch.setattr(paddle.device, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle.device.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(paddle, "is_compiled_with_rocm", lambda: False)
    device.current_decision.cache_clear()
    try:
        decision = device.current_decision("auto")
    finally:
        device.current_decision.cache_clear()
    assert decision.reason == ("AMP is off and training runs in float32: Paddle has CUDA but sees no GPU "
                               "(driver, container --gpus, or CUDA_VISIBLE_DEVICES).")
    assert "CPU build" not in decision.reason


# --------------------------------------------------------------------------- beyond CUDA: Paddle's own rules
from paddle_amp_ext import device as device_module  # noqa: E402
from paddle_amp_ext._compat import PADDLE_VERSION  # noqa: E402
from paddle_amp_ext.backends import Accelerator  # noqa: E402

ACCELERATORS = {
    "XPU1": Accelerator("xpu", xpu_generation=1),
    "XPU2": Accelerator("xpu", xpu_generation=2),
    "XPU3": Accelerator("xpu", xpu_generation=3),
    "npu": Accelerator("custom", device_type="npu"),
    "mlu": Accelerator("custom", device_type="mlu"),
    "MI250X": Accelerator("rocm", name="MI250X", compute_capability=(9, 0)),
    "ROCm cc 6": Accelerator("rocm", name="old", compute_capability=(6, 0)),
}
# dtype for requests auto, float16, bfloat16 (non-strict), under each version's auto_cast.py
BEYOND = {
    (3, 3, 1): {"XPU1": ("float32", "float32", "float32"), "XPU2": ("float16", "float16", "float32"),
                "XPU3": ("bfloat16", "float16", "bfloat16"), "npu": ("bfloat16", "float16", "bfloat16"),
                "mlu": ("float16", "float16", "float32"), "MI250X": ("bfloat16", "float16", "bfloat16"),
                "ROCm cc 6": ("bfloat16", "float16", "bfloat16")},
    (2, 6, 2): {"XPU1": ("float16", "float16", "float32"), "XPU2": ("float16", "float16", "float32"),
                "XPU3": ("float16", "float16", "float32"), "npu": ("float16", "float16", "float32"),
                "mlu": ("float16", "float16", "float32"), "MI250X": ("float16", "float16", "float32"),
                "ROCm cc 6": ("float32", "float32", "float32")},
}


@pytest.mark.parametrize("version", list(BEYOND))
@pytest.mark.parametrize("name", list(ACCELERATORS))
def test_rocm_xpu_and_custom_devices_get_the_verdict_of_each_paddle_version(version, name):
    for column, request in enumerate(REQUESTS):
        decision = decide(ACCELERATORS[name], request, paddle_version=version)
        assert decision.dtype == BEYOND[version][name][column], (request, decision.reason)
        assert decision.use_loss_scaling == (decision.dtype == "float16")
        assert ACCELERATORS[name].label in decision.reason
        assert f"Paddle {'.'.join(map(str, version))}" in decision.reason
        assert "python/paddle/amp/auto_cast.py" in decision.reason


def test_the_reasons_name_paddles_functions():
    assert "_is_xpu_float16_supported" in decide(ACCELERATORS["XPU1"], "float16", paddle_version=(3, 3, 1)).reason
    assert "_is_custom_device_bfloat16_supported" in decide(ACCELERATORS["mlu"], "bfloat16",
                                                            paddle_version=(3, 3, 1)).reason
    old_rocm = decide(ACCELERATORS["MI250X"], "bfloat16", paddle_version=(2, 6, 2)).reason
    assert "reads the compute capability (9.0)" in old_rocm and "a ROCm build does not have" in old_rocm
    with pytest.raises(AmpUnsupportedError, match=r"bfloat16 AMP requested, but Kunlun XPU 0 \(XPU2\) does not "
                                                  r"support bfloat16 AMP \(Paddle 3\.3\.1: "):
        decide(ACCELERATORS["XPU2"], "bfloat16", strict=True, paddle_version=(3, 3, 1))


@pytest.mark.parametrize("kind, patch, expected_30, expected_26", [
    ("xpu", {"place_device": lambda: (1, ""), "xpu_generation": lambda index: 2}, "float16", "float16"),
    ("xpu", {"place_device": lambda: (0, ""), "xpu_generation": lambda index: 3}, "bfloat16", "float16"),
    ("custom", {"place_device": lambda: (0, "npu")}, "bfloat16", "float16"),
    ("custom", {"place_device": lambda: (2, "mlu")}, "float16", "float16"),
])
def test_auto_cast_on_an_xpu_or_custom_place_asks_the_probed_device(monkeypatch, kind, patch, expected_30,
                                                                    expected_26):
    """Through the seams: the tracer's place and Paddle's device calls are replaced, the rule is real."""
    from paddle_amp_ext import autocast

    monkeypatch.setattr(device_module._compat, "place_kind", lambda: kind)
    for name, value in patch.items():
        monkeypatch.setattr(device_module._compat, name, value)
    probed = device_module.probe_accelerator()
    assert probed.kind == kind and probed.index == patch["place_device"]()[0]
    expected = expected_30 if PADDLE_VERSION[0] >= 3 else expected_26
    assert device_module.device_decision(kind, "auto").dtype == expected
    assert autocast.resolve_precision(True, "auto") == (True, expected)


def test_a_device_paddle_cannot_describe_is_named(monkeypatch):
    def broken(index):
        raise RuntimeError("XPU runtime missing")

    monkeypatch.setattr(device_module._compat, "place_device", lambda: (0, ""))
    monkeypatch.setattr(device_module._compat, "xpu_generation", broken)
    with pytest.raises(RuntimeError, match=r"Paddle could not describe its xpu device: RuntimeError\('XPU runtime"):
        device_module.probe_accelerator("xpu")


def test_a_cpu_place_has_no_accelerator():
    assert device_module.probe_accelerator("cpu") is None


@pytest.mark.parametrize("device_type, scaling_30", [("npu", False), ("mlu", True)])
def test_the_scalers_auto_follows_the_same_rule_on_a_custom_device(monkeypatch, device_type, scaling_30):
    """GradScaler(enable="auto") and auto_cast(dtype="auto") agree: loss scaling exactly where the
    verdict is float16 (3.x: bfloat16 on an NPU, so no scaling; 2.6: float16 everywhere)."""
    monkeypatch.setattr(device_module._compat, "place_kind", lambda: "custom")
    monkeypatch.setattr(device_module._compat, "place_device", lambda: (0, device_type))
    device_module.current_decision.cache_clear()
    try:
        decision = device_module.current_decision("auto")
        scaler = amp.GradScaler(enable="auto")
    finally:
        device_module.current_decision.cache_clear()
    expected = scaling_30 if PADDLE_VERSION[0] >= 3 else True
    assert decision.use_loss_scaling is expected and f"custom device {device_type}:0" in decision.reason
    assert scaler.is_enable() is expected
