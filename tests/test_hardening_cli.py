"""No misleading exits: the doctor, check and the launcher against bad input; rehearsal state; small inputs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import paddle
import pytest
from helpers import in_another_thread

import paddle_amp_ext as amp
from paddle_amp_ext import _compat, _state
from paddle_amp_ext.cli.check import main as check_main
from paddle_amp_ext.cli.visualdl import main as serve_main

MODEL = """
import sys
import paddle
from helper_mod import LOSS_SCALE

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Linear(4, 1))


def main():
    loss = model(paddle.ones([2, 4])).mean() * LOSS_SCALE
    {step}
    return {ret}
"""


def write_script(tmp_path, step="loss.backward()", ret="0", tail="sys.exit(main())", scale="1.0"):
    (tmp_path / "helper_mod.py").write_text(f"LOSS_SCALE = {scale}\n")  # imported from the script's folder
    script = tmp_path / "train.py"
    script.write_text(MODEL.format(step=step, ret=ret) + "\n" + tail + "\n")
    return script


def doctor(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.doctor", *map(str, args)], capture_output=True,
                          text=True, timeout=180, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def test_backward_overflow_in_a_script_ending_in_sys_exit_main_is_reported(tmp_path):
    script = write_script(tmp_path, scale="1e6")
    code, out, err = doctor("--json", script, cwd="/")  # cwd elsewhere: the script's folder is on sys.path
    report = json.loads(out)
    assert code == 1 and report["overflow"] and report["finding"]["direction"] == "backward"
    assert report["script_exit_code"] == 0
    assert "RuntimeWarning" not in err and "found in sys.modules" not in err


def test_the_scripts_except_exception_cannot_swallow_the_stop(tmp_path):
    step = "try:\n        (model(paddle.ones([2, 4]) * 1e6)).mean().backward()\n    except Exception:\n        pass"
    code, out, _ = doctor("--json", write_script(tmp_path, step=step), cwd=tmp_path)
    report = json.loads(out)
    assert code == 1 and report["finding"]["direction"] == "forward" and report["script_exit_code"] is None


def test_exit_codes_mean_one_thing_each(tmp_path):
    assert doctor(write_script(tmp_path))[0] == 0
    code, out, err = doctor(write_script(tmp_path, ret="3"))
    assert code == 3 and "the script exited with code 3" in out and "every watched value fits" in out
    code, out, err = doctor(write_script(tmp_path, step="raise KeyError('boom')"))
    assert code == 3 and "KeyError" in err and "the script raised KeyError" in out
    code, _, err = doctor(tmp_path / "missing.py")
    assert code == 2 and "No such script" in err
    code, _, err = doctor(tmp_path)
    assert code == 2 and "is a folder without a __main__.py: nothing to run" in err
    for bad in ("0", "-5", "inf", "x"):
        code, _, err = doctor("--loss-scale", bad, write_script(tmp_path))
        assert code == 2 and "--loss-scale" in err


def test_check_list_ops_json_and_config_errors(tmp_path, capsys):
    assert check_main(["--list-ops", "--json"]) == 0
    ops = json.loads(capsys.readouterr().out)
    assert ops["dtype"] == "float16" and "matmul_v2" in ops["white"]
    bad = tmp_path / "bad.toml"
    bad.write_text('custom_black_list = ["softmx"]\n')
    assert check_main(["--config", str(bad)]) == 2
    assert "Did you mean 'softmax'" in capsys.readouterr().err
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    assert check_main(["--config", str(deep)]) == 2
    assert "nested too deeply" in capsys.readouterr().err
    huge = tmp_path / "huge.json"
    huge.write_text('{"init_loss_scaling": 1' + "0" * 400 + "}")
    assert check_main(["--config", str(huge)]) == 2
    assert "init_loss_scaling" in capsys.readouterr().err
    good = tmp_path / "amp.toml"
    good.write_text('dtype = "bfloat16"\n')
    assert check_main(["--config", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["dtype"] == "float32"


@pytest.mark.parametrize("content,match", [
    (b'dtype = "float16"\nlevel = "\xff"\n', r"is not UTF-8 text"),
    (b'[amp]\ndtype = "bfloat16"\n[tool.other]\nx = 1\n', None),
    ('\ufeffdtype = "bfloat16"\n'.encode("utf-8"), None),
    (b'dtype = "bfloat16"\n[amp]\nlevel = "O2"\n', r"settings both at top level \['dtype'\] and in \[amp\]"),
])
def test_config_files_not_utf8_with_bom_or_other_tables(tmp_path, content, match):
    path = tmp_path / "amp.toml"
    path.write_bytes(content)
    if match is None:
        assert amp.AmpConfig.from_file(path).dtype == "bfloat16"
    else:
        with pytest.raises(ValueError, match=match):
            amp.AmpConfig.from_file(path)


def test_launcher_refuses_a_busy_or_bad_port_and_quotes_what_it_prints(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert serve_main(["--logdir", str(tmp_path), "--port", str(port)]) == 2
        assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
    assert serve_main(["--port", "-1"]) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err
    assert serve_main(["--print", "--logdir", "my runs; rm -rf x"]) == 0
    assert "'my runs; rm -rf x'" in capsys.readouterr().out


def test_launcher_warns_about_a_missing_logdir_and_then_starts_visualdl(tmp_path, capsys, monkeypatch):
    from paddle_amp_ext.cli import visualdl

    started = []
    monkeypatch.setattr(visualdl.os, "execv", lambda exe, argv: started.append(argv))
    with socket.socket() as probe:  # a port that is free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    missing = str(tmp_path / "nothing-yet")
    assert serve_main(["--logdir", missing, "--port", str(port)]) == 0
    assert "--logdir" in started[0] and started[0][started[0].index("--logdir") + 1] == missing
    assert f"--logdir {missing!r} does not exist yet" in capsys.readouterr().err
    assert serve_main(["--logdir", missing, "--port", "0"]) == 2 and len(started) == 1


def test_rehearsal_belongs_to_its_thread_and_paddles_dtype_is_restored():
    before = _compat.amp_state_dtype()
    model = paddle.nn.Linear(2, 2)
    with amp.fp16_emulation(model):
        seen = in_another_thread(lambda: (_state.emulated_dtype(), amp.GradScaler().is_enable()))
        assert _state.emulated_dtype() == "float16"
        with amp.fp16_emulation(model, dtype="bfloat16"):
            assert _state.emulated_dtype() == "bfloat16"
        assert _state.emulated_dtype() == "float16"
    assert seen == (None, False), "another thread neither sees the rehearsal nor turns its scaler on"
    assert _compat.amp_state_dtype() == before

def test_smaller_inputs_get_named_errors():
    with pytest.raises(ValueError, match=r"dtype must be one of \('float16', 'bfloat16'\). Received: dtype='fp16'"):
        amp.OverflowWatch(paddle.nn.Linear(2, 2), dtype="fp16")
    with pytest.raises(TypeError, match=r"fp16_emulation expects the model .* Received: None"):
        with amp.fp16_emulation(None):
            pass
    with pytest.raises(ValueError, match=r"limit must be a finite number > 0 .*Received: limit=-1"):
        amp.find_overflow(paddle.nn.Linear(2, 2), paddle.ones([1, 2]), limit=-1)
    with pytest.raises(ValueError, match=r"compute_capability must be a \(major, minor\) pair of ints"):
        amp.DeviceInfo(index=0, name="x", compute_capability=(True, 0))


def test_dockerfiles_run_as_a_user_and_the_readme_binds_the_dashboard_to_localhost():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        lines = [line.split() for line in (root / "docker" / name).read_text().splitlines() if line.strip()]
        users = [words[1] for words in lines if words[0] == "USER"]
        assert users and users[-1] not in ("root", "0"), f"{name} must end as a non-root USER"
    page = (root / "docs" / "docker.md").read_text()  # the Docker commands live on the Docker page
    assert "-p 8040:8040" not in page and "-p 127.0.0.1:8040:8040" in page

