"""Real low-precision behaviour on a CUDA GPU (skipped on CPU machines, never faked there)."""

from __future__ import annotations

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.check import main


def test_auto_cast_runs_matmul_in_the_decided_dtype():
    decision = amp.device.current_decision("auto")
    x = paddle.randn([32, 32])
    with amp.auto_cast(dtype="auto"):
        out = paddle.matmul(x, x)
    expected = decision.dtype if decision.enabled else "float32"
    assert str(out.dtype).endswith(expected)


def test_keep_fp32_layer_output_is_float32_under_real_autocast():
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 16), paddle.nn.Linear(16, 4))
    amp.keep_fp32(model, ["1"])
    with amp.auto_cast(dtype="float16"):
        hidden = model[0](paddle.randn([4, 16]))
        out = model(paddle.randn([4, 16]))
    if amp.device.current_decision("float16").enabled:
        assert hidden.dtype == paddle.float16
    assert out.dtype == paddle.float32


def test_decorate_o2_leaves_kept_layers_in_float32():
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 16), paddle.nn.Linear(16, 4))
    amp.keep_fp32(model, ["1"])
    model = amp.decorate(model, level="O2", dtype="float16")
    if amp.device.current_decision("float16").enabled:
        assert model[0].weight.dtype == paddle.float16
    assert model[1].weight.dtype == paddle.float32


def test_scaler_is_on_with_fp16_and_counts_an_injected_overflow():
    if not amp.device.current_decision("float16").enabled:
        pytest.skip("this GPU is below compute capability 7.0: float16 AMP is off")
    model = paddle.nn.Linear(8, 8)
    opt = paddle.optimizer.SGD(parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**10)
    with amp.auto_cast(dtype="float16"):
        loss = model(paddle.randn([4, 8])).mean()
    scaler.scale(loss * float("inf")).backward()
    result = scaler.step(opt)
    scaler.update()
    assert result.skipped and scaler.loss_scale == 2.0**9


def test_check_smoke_on_the_gpu(capsys):
    main(["--smoke"])
    out = capsys.readouterr().out
    assert "Smoke test: ok" in out or "AMP is off" in out
