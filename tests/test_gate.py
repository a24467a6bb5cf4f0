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
