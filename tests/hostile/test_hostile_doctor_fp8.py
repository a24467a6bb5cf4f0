"""Hostile uses of the doctor's FP8 mode: bad flags, missing or failing scripts, unwritable
advice, interrupts, threads, and Paddle 2.6 (no FP8 dtypes)."""

from __future__ import annotations

import json
import textwrap

import paddle
import pytest

from paddle_amp_ext.cli import doctor
from paddle_amp_ext.fp8.script import run_script_fp8

TRAIN = '''
import paddle
model = paddle.nn.Sequential(paddle.nn.Linear(4, 4))
model(paddle.ones([2, 4])).mean().backward()
'''


def write(tmp_path, body, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["--fp8", "hybrid"], "invalid choice: 'hybrid'"),
    (["--fp8", "current", "--loss-scale", "8"], "--dtype and --loss-scale apply to the fp16/bf16 doctor, not with --fp8"),
    (["--fp8", "current", "--dtype", "bfloat16"], "--dtype and --loss-scale apply to the fp16/bf16 doctor"),
])
def test_bad_flags_are_usage_errors(tmp_path, capsys, argv, message):
    assert doctor.main([*argv, write(tmp_path, TRAIN)]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_script_and_a_directory_are_usage_errors(tmp_path, capsys):
    assert doctor.main(["--fp8", "current", str(tmp_path / "gone.py")]) == 2
    assert "gone.py" in capsys.readouterr().err
    assert doctor.main(["--fp8", "current", str(tmp_path)]) == 2


def test_a_script_failing_before_any_model_call_exits_3_and_records_nothing(tmp_path, capsys):
    code = doctor.main(["--json", "--fp8", "blockwise", write(tmp_path, "raise RuntimeError('no data')\n")])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert code == 3
    assert data["diagnosis"] == "No FP8 quantization was recorded: run the model inside fp8_linears(model, ...) first."
    assert data["script_error"] == "RuntimeError('no data')" and "RuntimeError: no data" in captured.err


def test_sys_exit_after_a_clean_run_exits_3(tmp_path, capsys):
    assert doctor.main(["--fp8", "current", write(tmp_path, TRAIN + "import sys\nsys.exit(4)\n")]) == 3


def test_an_unwritable_advice_path_is_a_usage_error(tmp_path, capsys):
    assert doctor.main(["--fp8", "current", "--advise", str(tmp_path), write(tmp_path, TRAIN)]) == 2
    assert "cannot write --advise" in capsys.readouterr().err


def test_an_interrupt_propagates_and_restores_layers(tmp_path):
    body = TRAIN + "raise KeyboardInterrupt\n"
    before = paddle.nn.Layer.__call__
    with pytest.raises(KeyboardInterrupt):
        run_script_fp8(write(tmp_path, body), [], "current")
    assert paddle.nn.Layer.__call__ is before


def test_the_scripts_models_get_their_forward_back(tmp_path):
    body = TRAIN + "import builtins\nbuiltins._fp8_doctor_model = model\n"
    import builtins

    run = run_script_fp8(write(tmp_path, body), [], "current")
    model = builtins.__dict__.pop("_fp8_doctor_model")
    assert "forward" not in model[0].__dict__  # the FP8 forward is gone
    assert run.models == 1 and len(run.stats.records) == 3


def test_models_called_from_threads_are_switched_once(tmp_path):
    body = '''
    import threading
    import paddle
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4))
    def work():
        model(paddle.ones([2, 4]))
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    '''
    run = run_script_fp8(write(tmp_path, body), [], "current")
    assert run.exit_code == 0 and run.models == 1
    assert sorted(r.role for r in run.stats.records) == ["input"] * 3 + ["weight"] * 3


def test_a_bad_recipe_from_python_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"scaling must be one of \('blockwise', 'current', 'delayed'\)"):
        run_script_fp8(write(tmp_path, TRAIN), [], "hybrid")
    with pytest.raises(TypeError, match="recipe must be an Fp8Recipe"):
        run_script_fp8(write(tmp_path, TRAIN), [], 3)


def test_paddle_without_fp8_dtypes_says_so(tmp_path):
    run = run_script_fp8(write(tmp_path, TRAIN), [], "blockwise")
    if hasattr(paddle, "float8_e4m3fn"):
        assert run.notes == []
    else:  # Paddle 2.6
        assert run.notes == [f"Paddle {paddle.__version__} has no FP8 dtypes (paddle.float8_e4m3fn arrived in Paddle "
                             "3.0): Paddle's FP8 kernels are not emulated; the nn.Linear layers run as FP8 linears"]
    assert len(run.stats.records) == 3  # the linears are rehearsed either way
