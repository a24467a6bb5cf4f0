"""Every example runs as a user would run it, with short settings."""

from __future__ import annotations

import glob
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, *args: str, cwd: Path, expect: int = 0) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_train_minimal_is_short_and_logs(tmp_path):
    assert len((EXAMPLES / "train_minimal.py").read_text().splitlines()) <= 62
    out = run("train_minimal.py", "--steps", "30", "--emulate", "--logdir", "runs/m", cwd=tmp_path)
    assert "steps=30 skipped=0 final_scale=16384" in out
    assert len(glob.glob(str(tmp_path / "runs/m/*/vdlrecords.*"))) == 1


def test_train_hapi(tmp_path):
    out = run("train_hapi.py", "--epochs", "1", "--samples", "128", "--logdir", "runs/h", cwd=tmp_path)
    assert "logged to runs/h" in out
    assert len(glob.glob(str(tmp_path / "runs/h/*/vdlrecords.*"))) == 1


@pytest.mark.slow
def test_train_distributed_ranks_agree(tmp_path):
    from distributed import launch

    launch(EXAMPLES / "train_distributed.py", "--steps", "10", "--emulate", "--logdir", str(tmp_path / "runs"),
           log_dir=tmp_path / "log")
    lines = [line for f in sorted((tmp_path / "log").glob("workerlog.*")) for line in f.read_text().splitlines()
             if line.startswith("rank ")]
    assert len(lines) == 2
    assert lines[0].split(":", 1)[1] == lines[1].split(":", 1)[1], lines


def test_resume_after_kill_gives_the_identical_scale_trajectory(tmp_path):
    run("resume.py", "--ckpt", "full", "--steps", "24", "--trace", "full.jsonl", cwd=tmp_path)
    run("resume.py", "--ckpt", "ck", "--steps", "24", "--kill-at", "9", "--trace", "resumed.jsonl",
        cwd=tmp_path, expect=-signal.SIGKILL)
    out = run("resume.py", "--ckpt", "ck", "--steps", "24", "--trace", "resumed.jsonl", cwd=tmp_path)
    assert "resumed at step 10" in out
    full = [json.loads(line) for line in (tmp_path / "full.jsonl").read_text().splitlines()]
    resumed = [json.loads(line) for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert resumed == full and len(full) == 24
    assert [r["step"] for r in full if r["skipped"]] == [5, 17]


def test_export_fp32(tmp_path):
    out = run("export_fp32.py", "--out", "exported/model", "--steps", "5", cwd=tmp_path)
    assert "parameter dtypes: ['paddle.float32']; matches the trained model: True" in out


def test_demo(tmp_path):
    out = run("demo.py", "--steps", "120", "--logdir", "runs/demo", "--plot", "plot.png", cwd=tmp_path)
    assert "Summary" in out and "skipped steps" in out and "zero gradients" in out
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_plain_paddle_amp_script_is_guarded_when_run_through_the_launcher(tmp_path):
    assert "weights finite: False" in run("plain_paddle_amp.py", "--steps", "8", cwd=tmp_path)
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--logdir", "runs", str(EXAMPLES / "plain_paddle_amp.py"),
                           "--steps", "8"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "weights finite: True" in proc.stdout and "GradScaler 0: 8 steps, 1 skipped" in proc.stderr


def test_run_emulate_rehearses_an_unmodified_script(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--no-log", "--json", "--emulate", "float16",
                           str(EXAMPLES / "plain_paddle_amp.py"), "--steps", "8"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (scaler,) = json.loads(proc.stdout.strip().splitlines()[-1])["scalers"]
    assert (scaler["steps"], scaler["skipped"]) == (8, 1)
    assert (scaler["loss_scale_min"], scaler["loss_scale_max"]) == (512.0, 1024.0), "the scaler ran for real"
