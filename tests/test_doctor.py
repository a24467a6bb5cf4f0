"""The overflow doctor names the layer, the op, the direction and the fix."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import paddle
import pytest
from helpers import make_data

import paddle_amp_ext as amp


class Amplify(paddle.nn.Layer):
    """The planted culprit: multiplies by 1e5."""

    def forward(self, x):
        return x * 1e5


def planted_model():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), Amplify(), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))


def test_find_overflow_names_the_planted_layer_forward(caplog):
    x, _ = make_data()
    report = amp.find_overflow(planted_model(), x)
    culprit = report.culprit
    assert culprit is not None
    assert (culprit.layer, culprit.layer_type, culprit.direction) == ("1", "Amplify", "forward")
    assert culprit.max_abs > 65504
    text = str(report)
    assert "layer '1' (Amplify" in text and "forward pass" in text and "keep_fp32(model, ['1'])" in text
    assert "bfloat16" in text
    assert any("Overflow doctor" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_healthy_model_has_no_culprit():
    x, y = make_data()
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 1))
    report = amp.find_overflow(model, x, loss_fn=lambda out: paddle.nn.functional.mse_loss(out, y))
    assert not report and report.culprit is None and "every watched value fits" in str(report)
    assert all(p.grad is None for p in model.parameters()), "the doctor clears the gradients it made"


def test_backward_overflow_from_a_large_loss_scale():
    x, y = make_data()
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 1))
    report = amp.find_overflow(model, x, loss_fn=lambda out: paddle.nn.functional.mse_loss(out, y),
                               loss_scale=2.0**30)
    culprit = report.culprit
    assert culprit.direction == "backward" and culprit.layer == "2", "the last layer's backward runs first"
    assert (culprit.op, culprit.ops, culprit.layer_type) == ("matmul_v2", ("matmul_v2",), "Linear"), "named at the op"
    assert "lower init_loss_scaling" in str(report)


def test_bf16_range_and_a_nan_are_reported():
    class MakeNan(paddle.nn.Layer):
        def forward(self, x):
            return paddle.sqrt(x - 1e9)

    model = paddle.nn.Sequential(paddle.nn.Linear(8, 8), MakeNan())
    assert not amp.find_overflow(planted_model(), make_data()[0], dtype="bfloat16")
    report = amp.find_overflow(model, make_data()[0], dtype="bfloat16")
    assert report.culprit.layer == "1" and "non-finite" in str(report)
    with pytest.raises(ValueError, match="dtype must be one of"):
        amp.find_overflow(model, make_data()[0], dtype="float8")


def test_overflow_watch_names_the_culprit_when_the_scaler_skips(caplog):
    caplog.set_level(logging.WARNING, logger="paddle_amp_ext")
    model = planted_model()
    x, y = make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    watch = amp.OverflowWatch(model)
    scaler = amp.GradScaler(init_loss_scaling=1.0, hooks=[watch])
    with amp.fp16_emulation(model):
        scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
        assert scaler.step(opt).skipped
        scaler.update()
    watch.close()
    assert watch.last_report.culprit.layer == "1"
    assert any("step 0 overflowed" in r.getMessage() and "Amplify" in r.getMessage() for r in caplog.records)


def test_doctor_cli_stops_a_script_at_the_first_overflow(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import sys
        import paddle

        paddle.seed(0)  # a random Linear whose ReLU outputs all fall below 0.07 makes no forward overflow

        class Amplify(paddle.nn.Layer):
            def forward(self, x):
                return x * float(sys.argv[1])

        model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU())
        model.add_sublayer("boost", Amplify())
        model.add_sublayer("head", paddle.nn.Linear(8, 1))
        opt = paddle.optimizer.SGD(parameters=model.parameters())
        for step in range(3):
            loss = model(paddle.ones([2, 4])).mean()
            loss.backward()
            opt.step()
            opt.clear_grad()
        print("finished")
    '''))
    run = [sys.executable, "-m", "paddle_amp_ext.doctor", str(script)]
    bad = subprocess.run(run + ["1e6"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert "layer 'boost' (Amplify" in bad.stdout and "forward pass" in bad.stdout
    assert "finished" not in bad.stdout
    good = subprocess.run(run + ["1.0"], capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert "finished" in good.stdout and "every watched value fits" in good.stdout
    usage = subprocess.run([sys.executable, "-m", "paddle_amp_ext.doctor"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2
