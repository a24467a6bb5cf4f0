"""Every step reaches VisualDL however the script is shaped and however it ends, counted with
VisualDL's own LogReader in real child processes: no close(), `run`, SIGTERM, GC, flush_secs,
and no file outside the logdir."""

from __future__ import annotations

import gc
import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.events import StepEvent, StepResult

pytest.importorskip("visualdl")
from visualdl import LogReader  # noqa: E402

SCRIPTS = Path(__file__).parent / "child_scripts"
sys.path.insert(0, str(SCRIPTS))
from shapes import STEPS  # noqa: E402

#: the tags every step has (``amp/grad_norm`` too where the scaler computed a norm: with loss scaling off, its guard)
EVERY_STEP = {"amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"}
RUN = [sys.executable, "-m", "paddle_amp_ext.run"]


def points(logdir) -> list:
    """Per run directory under ``logdir`` (sorted by point count): {tag: [steps]}, read by LogReader."""
    runs = []
    for run in sorted(glob.glob(os.path.join(str(logdir), "*"))):
        (path,) = glob.glob(os.path.join(run, "vdlrecords.*"))  # VisualDL shows only the newest one
        reader = LogReader(file_path=path)
        runs.append({tag: [d.id for d in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]})
    return sorted(runs, key=lambda run: len(run.get("amp/loss", [])))


def assert_one_point_per_step(logdir, steps: list) -> None:
    runs = points(logdir)
    assert [len(run["amp/loss"]) for run in runs] == sorted(steps), "steps recorded per scaler"
    for run, n in zip(runs, sorted(steps)):
        assert_steps(run, n)


def assert_steps(run: dict, n: int) -> None:
    """Exactly the points 0..n-1 for every tag of ``run``."""
    assert EVERY_STEP <= set(run), set(run)
    assert run == {tag: list(range(n)) for tag in run}


def child(cmd: list, tmp_path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, **kwargs)


EXIT_CODES = {"sys_exit": 3, "exception": 1}


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(STEPS))
def test_every_step_is_recorded_without_close(tmp_path, shape):
    logdir = tmp_path / "runs"
    proc = child([sys.executable, str(SCRIPTS / "shapes.py"), shape, "hook", str(logdir)], tmp_path)
    assert proc.returncode == EXIT_CODES.get(shape, 0), proc.stderr[-3000:]
    assert_one_point_per_step(logdir, STEPS[shape])


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(STEPS))
def test_run_closes_the_hooks_it_attached(tmp_path, shape):
    logdir = tmp_path / "runs"
    proc = child([*RUN, "--logdir", str(logdir), "--json", str(SCRIPTS / "shapes.py"), shape, "run", str(logdir)],
                 tmp_path)
    assert proc.returncode == EXIT_CODES.get(shape, 0), proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(s["steps"] for s in summary["scalers"]) == sorted(STEPS[shape])
    assert_one_point_per_step(logdir, STEPS[shape])


def sigterm_child(tmp_path, cmd: list, wait_for: str) -> tuple:
    """Start ``cmd``, SIGTERM it once a stdout line starts with ``wait_for``; (returncode, stdout lines, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith(wait_for):
                proc.send_signal(signal.SIGTERM)
                break
        lines += [line.strip() for line in proc.stdout]
        return proc.wait(timeout=120), lines, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


PADDLE_SAYS = "`Termination signal` is detected by the operating system"  # on stdout


@pytest.mark.slow
def test_sigterm_flushes_and_ends_the_process_as_paddle_would(tmp_path):
    script = str(SCRIPTS / "sigterm.py")
    control = sigterm_child(tmp_path, [sys.executable, script, "none", "idle", str(tmp_path / "none")], "ready")
    hooked = sigterm_child(tmp_path, [sys.executable, script, "hook", "idle", str(tmp_path / "hook")], "ready")
    routed = sigterm_child(tmp_path, [*RUN, "--logdir", str(tmp_path / "run"), script, "run", "idle", "-"], "ready")
    for returncode, lines, stderr in (control, hooked, routed):
        assert returncode == -signal.SIGTERM, stderr[-3000:]  # Paddle's handler re-raises the signal
        assert PADDLE_SAYS in "\n".join(lines), "the handler installed before ours (Paddle's, in C) still ran"
        assert "not ended by the signal" not in lines
    assert_one_point_per_step(tmp_path / "hook", [120])
    assert_one_point_per_step(tmp_path / "run", [120])


@pytest.mark.slow
def test_sigterm_while_training_loses_no_finished_step(tmp_path):
    cmd = [sys.executable, str(SCRIPTS / "sigterm.py"), "hook", "training", str(tmp_path / "runs")]
    returncode, lines, stderr = sigterm_child(tmp_path, cmd, "step 130")
    assert returncode == -signal.SIGTERM, stderr[-3000:]
    printed = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    (run,) = points(tmp_path / "runs")
    recorded = len(run["amp/loss"])
    assert recorded - (printed[-1] + 1) in (0, 1), "every step whose update() returned (and maybe not yet printed)"
    assert_steps(run, recorded)


@pytest.mark.slow
def test_sigterm_in_the_middle_of_a_flush_is_handled_after_it(tmp_path):
    proc = child([sys.executable, str(SCRIPTS / "sigterm.py"), "hook", "in_flush", str(tmp_path / "runs")], tmp_path)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]
    assert "not ended by the signal" not in proc.stdout
    assert_one_point_per_step(tmp_path / "runs", [100])  # the batch being written when the signal came, whole


@pytest.mark.slow
def test_sigterm_chains_to_a_python_handler(tmp_path):
    cmd = [sys.executable, str(SCRIPTS / "sigterm.py"), "hook", "user_handler", str(tmp_path / "runs")]
    returncode, lines, stderr = sigterm_child(tmp_path, cmd, "ready")
    assert returncode == 7, stderr[-3000:]
    assert lines[-1] == "user handler"
    assert_one_point_per_step(tmp_path / "runs", [120])


def log_steps(hook, steps) -> None:
    for step in steps:
        hook.on_step(StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 65536.0), 0.1, 65536.0))


def test_a_hook_dropped_without_close_is_flushed_when_collected(tmp_path):
    def train_and_drop():
        scaler = amp.GradScaler(hooks=[amp.VisualDLHook(tmp_path, flush_every=50)])
        log_steps(scaler.hooks[0], range(7))
        return scaler.hooks[0].logdir

    logdir = train_and_drop()
    gc.collect()  # CPython frees it at return already; a cycle would wait for this
    (run,) = points(tmp_path)
    assert_steps(run, 7)
    (path,) = glob.glob(os.path.join(logdir, "vdlrecords.*"))
    reader = LogReader(file_path=path)
    assert [d.value for d in reader.get_data("scalar", "amp/loss_scale")] == [65536.0] * 7
    assert [d.value for d in reader.get_data("scalar", "amp/log2_loss_scale")] == [16.0] * 7


def test_flush_after_flush_secs_without_another_step(tmp_path):
    """The background flusher writes waiting steps a flush_secs after the last write, with no
    further step (a job whose last step is followed by a hung collective)."""
    import time

    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=1000, flush_secs=0.5)
    (path,) = glob.glob(os.path.join(tmp_path, "vdlrecords.*"))
    start = time.monotonic()
    log_steps(hook, range(3))
    assert os.path.getsize(path) < 100, "right after the steps: only the meta record"
    while os.path.getsize(path) < 100 and time.monotonic() - start < 10:
        time.sleep(0.02)
    waited = time.monotonic() - start
    for _ in range(100):  # the host rows are written first, the loss (a device value) right after
        if len(LogReader(file_path=path).get_data("scalar", "amp/loss")) == 3:
            break
        time.sleep(0.05)
    assert [d.id for d in LogReader(file_path=path).get_data("scalar", "amp/loss")] == [0, 1, 2]
    assert [d.id for d in LogReader(file_path=path).get_data("scalar", "amp/loss_scale")] == [0, 1, 2]
    assert 0.3 < waited < 5, waited
    log_steps(hook, [3])
    hook.close()
    assert [d.id for d in LogReader(file_path=path).get_data("scalar", "amp/loss")] == [0, 1, 2, 3]


@pytest.mark.parametrize("flush_secs", [0, -1.0, float("nan"), "10", True, None])
def test_bad_flush_secs_is_named(tmp_path, flush_secs):
    with pytest.raises(ValueError, match=rf"flush_secs must be a number of seconds > 0 .* "
                                         rf"Received: flush_secs={flush_secs!r}"):
        amp.VisualDLHook(tmp_path, flush_secs=flush_secs)
    assert not os.listdir(tmp_path), "nothing written for a hook that was refused"


NO_FILES_SCRIPT = """
import json, os, sys
import paddle
import paddle_amp_ext as amp

def tree(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)

home, tmp = os.environ["HOME"], os.environ["TMPDIR"]
before = (tree(home) if os.path.isdir(home) else None, tree(tmp))
scaler = amp.GradScaler(hooks=[amp.VisualDLHook(sys.argv[1], flush_every=2)])
model = paddle.nn.Linear(2, 1)
opt = paddle.optimizer.SGD(parameters=model.parameters())
for _ in range(5):
    scaler.scale(model(paddle.ones([1, 2])).mean()).backward()
    scaler.step(opt)
    scaler.update()
after = (tree(home) if os.path.isdir(home) else None, tree(tmp))
print(json.dumps({"before": before, "after": after, "visualdl_imported": "visualdl" in sys.modules}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("home", ["fresh", "/proc/no-home"])
def test_no_file_outside_the_logdir(tmp_path, home):
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home") if home == "fresh" else home, "TMPDIR": str(tmp_path / "tmp")}
    proc = child([sys.executable, "-c", NO_FILES_SCRIPT, str(tmp_path / "runs")], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["after"] == out["before"], "creating and using a hook wrote nothing in $HOME or $TMPDIR"
    assert not out["visualdl_imported"]
    left = sorted(str(p.relative_to(tmp_path / "tmp")) for p in (tmp_path / "tmp").rglob("*"))
    assert left == out["before"][1], "nothing left in $TMPDIR at exit (Paddle's own .cache aside)"
    assert not glob.glob(str(tmp_path / "tmp" / "paddle-amp-ext-*"))
    if home == "fresh":
        assert ".visualdl" not in os.listdir(tmp_path / "home")
    assert_one_point_per_step(tmp_path / "runs", [5])


def test_meta_record_is_byte_identical_to_visualdl():
    import struct

    from visualdl.component.base_component import meta_data

    from paddle_amp_ext.visualdl.records import meta_record

    for wall in (0, 1, 1795988211313):
        data = meta_data(walltime=wall).SerializeToString()
        assert meta_record(wall) == struct.pack("<Q", len(data)) + data


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_writes_the_parents_buffered_steps(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=50)
    log_steps(hook, range(3))
    pid = os.fork()
    if pid == 0:  # a DataLoader worker ending: at exit, or by SIGTERM, as workers are stopped
        from paddle_amp_ext.visualdl import shutdown

        shutdown.close_all()
        hook.close()  # its copy of the writer, too, leaves the parent's steps to the parent
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, "the child still ends by the signal"
    hook.close()
    (path,) = glob.glob(os.path.join(tmp_path, "vdlrecords.*"))
    assert [d.id for d in LogReader(file_path=path).get_data("scalar", "amp/loss")] == [0, 1, 2]
