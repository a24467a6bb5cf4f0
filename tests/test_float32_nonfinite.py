"""The advisor and the doctor never certify a batch that is already inf/nan in float32."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp


def nan_batch():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 1))
    x = np.ones([2, 4], dtype="float32")
    x[0, 1] = np.nan
    return model, paddle.to_tensor(x)


def test_advise_says_the_model_produces_nan_without_amp():
    model, x = nan_batch()
    advice = amp.advise(model, x, loss_fn=lambda out: out.mean())
    assert advice.float32_nonfinite == "first at matmul_v2 in 0, in the forward pass"
    assert (advice.clean, advice.fp32_layers) == (False, ())
    assert "No proposal: the model produces NaN/inf without AMP (first at matmul_v2 in 0, in the forward" in str(advice)
    with pytest.raises(ValueError, match="No AMP config to propose: the model produces NaN/inf without AMP"):
        advice.to_config()
    assert all(p.grad is None or not p.grad.numpy().any() for p in model.parameters()), "gradients cleared"


def test_advise_checks_the_loss_too():
    paddle.seed(0)
    model = paddle.nn.Linear(4, 1)
    advice = amp.advise(model, paddle.ones([2, 4]), loss_fn=lambda out: paddle.log(out.abs() * 0.0 - 1.0).mean())
    assert advice.float32_nonfinite == "at the loss" and not advice.clean
    healthy = amp.advise(model, paddle.ones([2, 4]), loss_fn=lambda out: out.mean())
    assert healthy.float32_nonfinite is None and healthy.clean


def test_find_overflow_tells_a_float32_nan_from_an_fp16_overflow():
    model, x = nan_batch()
    report = amp.find_overflow(model, x)
    assert report.culprit.in_float32 and report.culprit.layer == "0"
    assert "the model produces NaN/inf without AMP: op 'matmul_v2' in layer '0' (Linear)" in str(report)
    assert "keep_fp32" not in str(report) and "no AMP setting can" in str(report)
    big = paddle.nn.Sequential(paddle.nn.Linear(4, 1))  # a sublayer: keep_fp32 never names the model itself
    big[0].weight.set_value(paddle.full([4, 1], 1e5))
    overflow = amp.find_overflow(big, paddle.ones([1, 4]))
    assert not overflow.culprit.in_float32 and "keep_fp32" in str(overflow)


SCRIPT = textwrap.dedent('''
    import numpy as np
    import paddle

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 1))
    opt = paddle.optimizer.SGD(parameters=model.parameters())
    x = np.ones([2, 4], dtype="float32")
    x[0, 1] = np.nan
    loss = model(paddle.to_tensor(x)).mean()
    loss.backward()
    opt.step()
''')


def test_the_doctor_cli_exits_non_zero_on_a_float32_nan(tmp_path):
    script = tmp_path / "nan_batch.py"
    script.write_text(SCRIPT)
    out = tmp_path / "amp.toml"
    advise = subprocess.run([sys.executable, "-m", "paddle_amp_ext.doctor", "--advise", str(out), "--json",
                             str(script)], capture_output=True, text=True, timeout=300)
    assert advise.returncode == 1, advise.stderr[-3000:]
    data = json.loads(advise.stdout)
    assert (data["clean"], data["float32_finite"], data["config"]) == (False, False, None)
    assert not out.exists(), "nothing certified, nothing written"
    doctor = subprocess.run([sys.executable, "-m", "paddle_amp_ext.doctor", "--json", str(script)],
                            capture_output=True, text=True, timeout=300)
    assert doctor.returncode == 1, doctor.stderr[-3000:]
    data = json.loads(doctor.stdout)
    assert data["float32_finite"] is False and data["finding"]["in_float32"] is True
    assert data["finding"]["layer"] == "0" and "no AMP setting can" in data["finding"]["fixes"][0]
