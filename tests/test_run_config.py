"""`python -m paddle_amp_ext.run`: the file `doctor --advise` writes, applied key by key; `--logdir` checked first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ATTENTION_MODEL_SCRIPT

import paddle_amp_ext as amp
from paddle_amp_ext.cli import run

# The attention model whose logits reach 80000 (beyond float16) under the script's own loop and
# scaler; it reports what ran, for the test to compare with the advice.
SCRIPT = ATTENTION_MODEL_SCRIPT + """
import numpy as np

from paddle_amp_ext.keep import is_kept_fp32

opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
x = paddle.rand([2, 4, 64])
finite = []
for step in range(3):
    with paddle.amp.auto_cast():
        loss = model(x).mean()
    finite.append(bool(np.isfinite(loss.numpy()).all()))
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
print("REPORT", finite, sorted(name for name, sub in model.named_sublayers() if is_kept_fp32(sub)))
"""


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _report(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    return line[len("REPORT "):], json.loads(proc.stdout.strip().splitlines()[-1])["scalers"][0]


@pytest.mark.slow
def test_run_applies_every_key_of_the_file_doctor_advise_writes(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    advised = _run("paddle_amp_ext.doctor", "--advise", "amp.toml", "train.py", cwd=tmp_path)
    assert advised.returncode == 0, advised.stderr[-3000:]
    config = amp.AmpConfig.from_file(tmp_path / "amp.toml")
    assert config.given == {"dtype", "fp32_layers", "init_loss_scaling"}, "the file holds the proposal only"
    assert config.fp32_layers == ("0.self_attn",)

    plain = _run("paddle_amp_ext.run", "--no-log", "--json", "--emulate", "float16", "train.py", cwd=tmp_path)
    report, scaler = _report(plain)
    assert report == "[False, False, False] []", "the control: float16 overflows in the attention logits"
    assert (scaler["skipped"], scaler["loss_scale_max"]) == (3, 1024.0)

    applied = _run("paddle_amp_ext.run", "--no-log", "--json", "--emulate", "float16", "--config", "amp.toml",
                   "train.py", cwd=tmp_path)
    report, scaler = _report(applied)
    assert report == "[True, True, True] ['0.self_attn']", "fp32_layers kept in the script's model"
    assert scaler["skipped"] == 0
    assert scaler["loss_scale_min"] == scaler["loss_scale_max"] == config.init_loss_scaling, "over the script's 1024"
    assert (f"The AMP config's init_loss_scaling={config.init_loss_scaling!r} replaces the init_loss_scaling=1024 "
            "passed to paddle.amp.GradScaler.") in applied.stderr


def test_a_config_file_sets_the_keys_it_has_even_at_their_defaults(tmp_path):
    (tmp_path / "amp.toml").write_text("init_loss_scaling = 65536.0\nfp32_layers = ['head']\n")
    config = amp.AmpConfig.from_file(tmp_path / "amp.toml")
    assert config.given == {"init_loss_scaling", "fp32_layers"}
    assert amp.AmpConfig(init_loss_scaling=65536.0, incr_ratio=3.0).given == {"incr_ratio"}, "in code: not defaults"
    assert config.replace(incr_ratio=2.0).given == {"init_loss_scaling", "fp32_layers", "incr_ratio"}
    assert config.to_toml(keys=config.given) == 'fp32_layers = ["head"]\ninit_loss_scaling = 65536.0\n'
    assert amp.AmpConfig.from_file(tmp_path / "amp.toml") == amp.AmpConfig(fp32_layers=["head"])


def _unwritable_folder(tmp_path):
    """A folder this process cannot create anything in: read-only by its mode, or (as root, whom
    modes do not stop) sysfs, where mkdir is refused to everyone."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o500)
    for candidate in (str(folder), "/sys"):
        try:
            os.mkdir(os.path.join(candidate, "probe"))
        except OSError:
            return candidate
        os.rmdir(os.path.join(candidate, "probe"))
    pytest.skip("no folder here refuses this user a new directory")


@pytest.mark.parametrize("kind", ["a file", "under a file", "unwritable"])
def test_a_logdir_that_cannot_be_written_is_a_usage_error_before_the_script_starts(tmp_path, capsys, kind):
    (tmp_path / "afile").write_text("")
    if kind == "a file":
        logdir, says = str(tmp_path / "afile"), "is a file, not a folder for the VisualDL logs"
    elif kind == "under a file":
        logdir, says = str(tmp_path / "afile" / "runs"), f"lies under the file {str(tmp_path / 'afile')!r}"
    else:
        logdir, says = os.path.join(_unwritable_folder(tmp_path), "runs"), "is not writable"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    assert run.main(["--logdir", logdir, str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m paddle_amp_ext.run: error: --logdir {logdir!r} {says}")
    assert err.rstrip().endswith("pass a writable folder, or --no-log.")
    assert not (tmp_path / "started").exists(), "the script did not start"
    assert run.main(["--no-log", "--logdir", logdir, str(script)]) == 0, "--no-log writes nothing there"
    assert (tmp_path / "started").exists()
