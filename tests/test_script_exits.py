"""``run`` and ``doctor`` end as ``python script.py`` would: ``sys.exit("message")`` prints the
message on stderr and exits 1, ``sys.exit(3.5)`` prints ``3.5``, ``sys.exit(None)`` exits 0; and
``doctor --advise`` shows the script's own error raised before its first model call."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paddle_amp_ext.cli.doctor import main as doctor_main
from paddle_amp_ext.cli.run import main as run_main

EXITS = ['sys.exit("no data in /data/train")', "sys.exit(3.5)", "sys.exit(None)", "sys.exit()", "sys.exit(4)",
         "sys.exit(['a', 1])", "sys.exit(True)", 'raise SystemExit("stopped by the script")']


def script_with(tmp_path, ending):
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nprint('started')\n{ending}\n")
    return script


def as_python(script):
    """The control: what ``python script.py`` prints on stderr and its exit code."""
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("ending", EXITS)
def test_run_ends_as_python_does(tmp_path, capsys, ending):
    script = script_with(tmp_path, ending)
    code, err = as_python(script)
    assert run_main(["--no-log", str(script)]) == code
    out = capsys.readouterr()
    assert out.out == "started\n"
    assert out.err.startswith(err), "Python's own message first, then the summary"
    assert out.err[len(err):].startswith(f"paddle_amp_ext.run: {script} exited with code {code}.")


def test_the_messages_python_prints():
    """What the control prints, spelled out, so the parametrized test cannot pass vacuously."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        ends = {ending: as_python(script_with(Path(folder), ending)) for ending in EXITS}
    assert ends == {'sys.exit("no data in /data/train")': (1, "no data in /data/train\n"),
                    "sys.exit(3.5)": (1, "3.5\n"), "sys.exit(None)": (0, ""), "sys.exit()": (0, ""),
                    "sys.exit(4)": (4, ""), "sys.exit(['a', 1])": (1, "['a', 1]\n"), "sys.exit(True)": (1, ""),
                    'raise SystemExit("stopped by the script")': (1, "stopped by the script\n")}


@pytest.mark.parametrize("ending", EXITS)
def test_doctor_prints_the_message_and_keeps_its_exit_codes(tmp_path, capsys, ending):
    script = script_with(tmp_path, ending)
    code, err = as_python(script)
    assert doctor_main(["--json", str(script)]) == (0 if code == 0 else 3)
    out = capsys.readouterr()
    assert out.err == err
    report = json.loads(out.out.split("started\n", 1)[1])
    assert report["script_exit_code"] == code
    assert report["script_exit_message"] == (err.rstrip("\n") or None)


MODEL_AFTER = """
import sys
import paddle
{before}
model = paddle.nn.Linear(4, 1)
model(paddle.ones([2, 4])).mean().backward()
"""


def test_advise_shows_the_scripts_own_error_before_its_first_model_call(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(MODEL_AFTER.format(before="open('/no/such/data/train.bin')"))
    assert doctor_main(["--advise", str(tmp_path / "amp.toml"), str(script)]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "FileNotFoundError: [Errno 2] No such file or directory: '/no/such/data/train.bin'" in err
    assert err.rstrip().endswith(f"python -m paddle_amp_ext.doctor: {script} raised FileNotFoundError before its "
                                 "first model call: nothing to advise on (exit code 3).")
    assert "ended without calling" not in err
    assert not (tmp_path / "amp.toml").exists()


def test_advise_shows_a_sys_exit_message_and_a_clean_end_is_a_usage_error(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(MODEL_AFTER.format(before="sys.exit('set DATA_DIR first')"))
    assert doctor_main(["--advise", str(tmp_path / "amp.toml"), str(script)]) == 3
    err = capsys.readouterr().err
    assert err == (f"set DATA_DIR first\npython -m paddle_amp_ext.doctor: {script} exited with code 1 before its "
                   "first model call: nothing to advise on (exit code 3).\n")
    script.write_text("import paddle\nprint('no model here')\n")
    assert doctor_main(["--advise", str(tmp_path / "amp.toml"), str(script)]) == 2
    assert (f"{script} ended without calling a paddle.nn.Layer: nothing to advise on."
            in capsys.readouterr().err)
