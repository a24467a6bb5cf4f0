"""Logging never kills training and never corrupts what was written: full disks, bad logdirs, closed hooks."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

import paddle_amp_ext as amp

pytest.importorskip("visualdl")

SCRIPT = textwrap.dedent("""
    import glob, json, logging, os, resource, sys
    import paddle
    import paddle_amp_ext as amp
    from paddle_amp_ext.events import StepEvent, StepResult
    from visualdl import LogReader

    logdir, limit = sys.argv[1], int(sys.argv[2])
    hook = amp.VisualDLHook(logdir, flush_every=10)
    path = glob.glob(os.path.join(hook.logdir, "vdlrecords.*"))[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))   # the disk fills after a few flushes
    scaler_errors = 0
    for step in range(300):
        event = StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 1024.0), 0.1, 1024.0)
        try:
            hook.on_step(event)
        except OSError:
            scaler_errors += 1
    size_full = os.path.getsize(path)
    backlog = hook._out.backlog
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))   # room again: the next flush retries
    for step in range(300, 310):
        hook.on_step(StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 1024.0), 0.1, 1024.0))
    hook.close()
    steps = [d.id for d in LogReader(file_path=path).get_data("scalar", "amp/loss")]
    print(json.dumps(dict(errors=scaler_errors, size_full=size_full, backlog=backlog, steps=steps,
                          dropped=hook.dropped_steps)))
""")


def test_a_full_disk_neither_raises_nor_corrupts_and_the_backlog_is_written_later(tmp_path):
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "runs"), "4096"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == 0, "a write error reached the training loop"
    assert out["size_full"] <= 4096 and out["backlog"] > 0
    assert out["steps"] == list(range(310)), "every step is readable once the disk had room, in order"
    assert out["dropped"] == 0
    assert "could not write to" in proc.stderr and proc.stderr.count("could not write to") == 1, "warned once"


def test_backlog_is_bounded_and_dropped_steps_are_reported_at_close(tmp_path, caplog_amp, monkeypatch):
    import paddle

    from paddle_amp_ext import visualdl
    from paddle_amp_ext.events import StepEvent, StepResult

    hook = amp.VisualDLHook(tmp_path, flush_every=5)
    monkeypatch.setattr(visualdl._BatchedWriter, "MAX_BACKLOG", 20)

    def full(data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hook._out._file, "write_bytes", full)
    for step in range(50):
        hook.on_step(StepEvent(step, paddle.to_tensor(1.0), StepResult(False, 1.0), None, 1.0))
    assert hook._out.backlog == 20 and hook.dropped_steps == 30  # oldest first
    hook.close()
    assert hook.dropped_steps == 50
    assert "50 steps could not be written" in caplog_amp.text
    assert caplog_amp.text.count("could not write to") == 1


@pytest.mark.parametrize("logdir,error,match", [
    ("", ValueError, r"logdir must be a directory path .* Received: logdir='' \(empty\)"),
    (None, TypeError, r"Received: logdir=None \(of type NoneType\)"),
    (3, TypeError, r"Received: logdir=3 \(of type int\)"),
])
def test_bad_logdirs_are_named_when_the_hook_is_made(logdir, error, match):
    with pytest.raises(error, match=match):
        amp.VisualDLHook(logdir)
    with pytest.raises(error, match=match):
        amp.VisualDLCallback(logdir)


def test_a_file_or_an_unwritable_logdir_fails_at_creation(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"is a file, not a directory"):
        amp.VisualDLHook(afile)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OSError, match=r"cannot write to logdir"):
            amp.VisualDLHook(locked / "run")
    with pytest.raises(OSError, match=r"VisualDL hook cannot write to logdir '/proc/paddle-amp-ext/"):
        amp.VisualDLHook("/proc/paddle-amp-ext")


def test_on_step_after_close_warns_once(tmp_path, caplog_amp):
    import paddle

    from paddle_amp_ext.events import StepEvent, StepResult

    hook = amp.VisualDLHook(tmp_path)
    hook.close()
    for step in (7, 8):
        hook.on_step(StepEvent(step, paddle.to_tensor(1.0), StepResult(False, 1.0), None, 1.0))
    assert caplog_amp.text.count("on_step after close(): step 7 and later steps are not logged") == 1


def test_hook_works_where_home_is_unusable(tmp_path):
    code = ("import paddle_amp_ext as amp, sys; h = amp.VisualDLHook(sys.argv[1]); h.close(); "
            "print('OK', h.logdir)")
    env = {**os.environ, "HOME": "/proc/no-home"}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OK" in proc.stdout and glob.glob(str(tmp_path / "runs" / "*" / "vdlrecords.*"))
