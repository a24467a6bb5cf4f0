"""The doctor's FP8 mode (``--fp8 RECIPE``): the layer and tensor that lose most, the fix, the advice."""

from __future__ import annotations

import json
import textwrap

import paddle
import pytest

from paddle_amp_ext.cli import doctor

SCRIPT = '''
import sys
import paddle

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU())
model.add_sublayer("head", paddle.nn.Linear(16, 1))
loss_fn = paddle.nn.MSELoss()
opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
x = paddle.ones([4, 8]) * float(sys.argv[1])
for step in range(3):
    loss = loss_fn(model(x), paddle.zeros([4, 1])) * float(sys.argv[2])
    loss.backward()
    opt.step()
    opt.clear_grad()
print("finished")
'''


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return str(path)


def run_json(capsys, *argv):
    code = doctor.main(["--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{"):])


def test_a_clean_run_exits_0_and_says_so(script, capsys):
    code, data = run_json(capsys, "--fp8", "current", script, "0.5", "1")
    assert code == 0
    assert data["worst"] is None and data["script_exit_code"] == 0
    assert data["diagnosis"] == ("FP8 loses little: no tensor of 2 FP8 linears saturates or flushes more than "
                                 "1.0% of its values.")
    assert {(row["layer"], row["tensor"]) for row in data["summary"]} == {
        (layer, tensor) for layer in ("0", "head") for tensor in ("input", "weight", "output_grad")}
    assert {row["steps"] for row in data["summary"]} == {3}  # model, loss, model: a step per model call


def test_saturated_inputs_name_the_layer_the_tensor_and_the_fix(script, capsys, tmp_path):
    toml = tmp_path / "amp.toml"
    code, data = run_json(capsys, "--fp8", "delayed", "--advise", str(toml), script, "1e4", "1")
    assert code == 1
    assert (data["worst"]["layer"], data["worst"]["tensor"], data["worst"]["saturated"]) == ("0", "input", 1.0)
    assert data["diagnosis"].startswith("layer '0' input: 100.00% of values saturate at +-max (e4m3fn); keep the "
                                        "layer in bf16 (fp8_exclude_layers), use current or blockwise scaling")
    assert toml.read_text() == 'fp8_exclude_layers = ["0", "head"]\n'
    assert data["fp8_exclude_layers"] == ["0", "head"]


def test_flushed_output_gradients_are_named(script, capsys):
    code, data = run_json(capsys, "--fp8", "delayed", script, "0.5", "1e-9")
    assert code == 1
    assert (data["worst"]["layer"], data["worst"]["tensor"], data["worst"]["flushed"]) == ("head", "output_grad", 1.0)
    assert "flush to zero (e5m2)" in data["diagnosis"]


def test_the_text_report_and_the_advised_config_keep_the_layers_out(script, capsys, tmp_path):
    from paddle_amp_ext.config import AmpConfig

    toml = tmp_path / "amp.toml"
    assert doctor.main(["--fp8", "delayed", "--advise", str(toml), script, "1e4", "1"]) == 1
    out = capsys.readouterr().out
    assert "FP8 rehearsal, recipe 'delayed': 18 quantizations of 2 FP8 linears in 2 model(s)." in out
    assert f"Wrote {toml}: fp8_exclude_layers = ['0', 'head']." in out and "(exit code 1)" in out
    assert AmpConfig.from_file(str(toml)).fp8_exclude_layers == ("0", "head")


def test_the_script_runs_with_its_own_layers_afterwards(script, capsys):
    before = paddle.nn.Layer.__call__
    doctor.main(["--fp8", "blockwise", script, "0.5", "1"])
    assert paddle.nn.Layer.__call__ is before
    assert "finished" in capsys.readouterr().out


def test_a_run_longer_than_the_stats_window_is_counted_and_summarized_whole(tmp_path, capsys):
    """150 steps, more than the 100 the stats keep: every quantization counted, every step summarized."""
    path = tmp_path / "long.py"
    path.write_text("import paddle\nmodel = paddle.nn.Linear(4, 4)\nfor _ in range(150):\n"
                    "    model(paddle.ones([2, 4]))\n")
    code = doctor.main(["--fp8", "current", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and "300 quantizations of 1 FP8 linears in 1 model(s)." in out
    code, data = run_json(capsys, "--fp8", "current", str(path))
    assert {(row["tensor"], row["steps"]) for row in data["summary"]} == {("input", 150), ("weight", 150)}
