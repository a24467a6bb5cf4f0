"""The VisualDL writer against a hostile world: planted links and FIFOs in a shared logdir, removed
and read-only directories, huge flushes, failing disks, signals in the middle of a flush, kills
that run no Python (SIGKILL, SIGABRT), threads, forks, copies, and losses that are not one value.
Every record is read back with VisualDL's own LogReader."""

from __future__ import annotations

import copy
import glob
import math
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.events import StepEvent, StepResult
from paddle_amp_ext.visualdl import records

pytest.importorskip("visualdl")
from visualdl import LogReader  # noqa: E402

CHILD = Path(__file__).parent.parent / "child_scripts" / "records_child.py"
HOST_TAGS = ["amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"]


def event(step, loss=None):
    loss = paddle.to_tensor(float(step)) if loss is None else loss
    return StepEvent(step, loss, StepResult(False, 1024.0), 0.5, 1024.0)


def log(hook, steps):
    for step in steps:
        hook.on_step(event(step))


def files(directory) -> list:
    return sorted(glob.glob(os.path.join(str(directory), "vdlrecords.*")))


def series(path, tag="amp/loss") -> list:
    return [(d.id, d.value) for d in LogReader(file_path=str(path)).get_data("scalar", tag)]


def steps_in(path, tag="amp/loss") -> list:
    return [s for s, _ in series(path, tag)]


# ---------------------------------------------------------------- links, FIFOs, exclusive creation
@pytest.fixture
def shared(tmp_path):
    """A world-writable sticky logdir (as /tmp) and a directory outside it an attacker points at."""
    logdir, outside = tmp_path / "shared", tmp_path / "victim"
    logdir.mkdir()
    outside.mkdir()
    logdir.chmod(0o1777)
    return logdir, outside


def test_a_link_planted_as_the_run_directory_is_never_followed(shared):
    logdir, outside = shared
    (logdir / "exp").symlink_to(outside)
    with pytest.raises(OSError, match=r"VisualDL hook cannot write to logdir .*exp'.* will not write into "
                                      r".*exp': it is a symbolic link or not a directory"):
        amp.VisualDLHook(logdir, run_name="exp")
    assert os.listdir(outside) == [], "nothing created where the link points"
    assert (logdir / "exp").is_symlink()


def test_a_link_planted_as_the_rank_directory_is_never_followed(shared, monkeypatch):
    from paddle_amp_ext.visualdl import hook as hook_module

    logdir, outside = shared
    (logdir / "exp").mkdir()
    (logdir / "exp" / "rank1").symlink_to(outside)
    monkeypatch.setattr(hook_module, "_rank", lambda: (1, 2))
    with pytest.raises(OSError, match=r"rank1': it is a symbolic link or not a directory"):
        amp.VisualDLHook(logdir, run_name="exp", all_ranks=True)
    assert os.listdir(outside) == []


@pytest.mark.parametrize("planted", ["link", "dangling_link", "fifo", "file"])
def test_an_entry_planted_at_the_record_file_name_gets_a_new_file(shared, monkeypatch, planted):
    logdir, outside = shared
    monkeypatch.setattr(records.time, "time", lambda: 1796000000.0)  # the name an attacker predicts
    run = logdir / "exp"
    run.mkdir()
    name = run / "vdlrecords.1796000000.log"
    target = outside / "target"
    if planted == "link":
        target.write_bytes(b"precious")
        name.symlink_to(target)
    elif planted == "dangling_link":
        name.symlink_to(target)
    elif planted == "fifo":
        os.mkfifo(name)  # opening it for writing would block forever
    else:
        name.write_bytes(b"someone else's")
    monkeypatch.setattr("paddle_amp_ext.visualdl.hook._has_records", lambda path: False)  # the name is taken anyway
    hook = amp.VisualDLHook(logdir, run_name="exp")
    log(hook, range(3))
    hook.close()
    assert hook._out.path == str(name) + f".{os.getpid()}.0"
    assert steps_in(hook._out.path) == [0, 1, 2]
    if planted == "link":
        assert target.read_bytes() == b"precious" and name.is_symlink()
    elif planted == "dangling_link":
        assert not target.exists(), "the link's target was not created"
    elif planted == "fifo":
        assert stat.S_ISFIFO(os.lstat(name).st_mode)
    else:
        assert name.read_bytes() == b"someone else's"
    assert sorted(os.listdir(outside)) == (["target"] if planted == "link" else [])


def test_the_record_file_is_created_new_with_no_link_following():
    assert records._FILE_FLAGS & os.O_EXCL and records._FILE_FLAGS & os.O_CREAT
    assert records._FILE_FLAGS & os.O_NOFOLLOW and records._DIR_FLAGS & os.O_NOFOLLOW


def test_the_users_own_logdir_link_is_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "runs").symlink_to(real)
    with amp.VisualDLHook(tmp_path / "runs", run_name="exp") as hook:
        log(hook, range(2))
    assert steps_in(files(real / "exp")[0]) == [0, 1]


# ---------------------------------------------------------------- run directories
def test_two_hooks_with_one_run_name_are_two_runs(tmp_path, caplog_amp):
    first = amp.VisualDLHook(tmp_path, run_name="exp")
    second = amp.VisualDLHook(tmp_path, run_name="exp")
    third = amp.VisualDLHook(tmp_path, run_name="exp")
    log(first, range(2))
    log(second, range(3))
    first.close()
    second.close()
    third.close()
    assert [first.logdir, second.logdir, third.logdir] == [str(tmp_path / "exp"), str(tmp_path / "exp-1"),
                                                           str(tmp_path / "exp-2")]
    assert steps_in(files(tmp_path / "exp")[0]) == [0, 1]
    assert steps_in(files(tmp_path / "exp-1")[0]) == [0, 1, 2]
    assert f"{tmp_path / 'exp'} already holds records" in caplog_amp.text
    assert f"this hook writes to {tmp_path / 'exp-1'}. Pass another run_name" in caplog_amp.text


def test_writing_into_a_logdir_that_holds_records_is_named(tmp_path, caplog_amp):
    amp.VisualDLHook(tmp_path, run_name="").close()
    second = amp.VisualDLHook(tmp_path, run_name="")
    second.close()
    assert second.logdir == str(tmp_path)
    assert "already holds a record file and VisualDL shows only the newest one" in caplog_amp.text
    assert "Pass run_name=None" in caplog_amp.text


@pytest.mark.parametrize("removed", ["run", "logdir"])
def test_a_removed_directory_is_re_created_with_a_warning(tmp_path, caplog_amp, removed):
    logdir = tmp_path / "runs"
    hook = amp.VisualDLHook(logdir, run_name="exp", flush_every=5)
    log(hook, range(5))
    old = hook._out.path
    shutil.rmtree(logdir / "exp" if removed == "run" else logdir)
    log(hook, range(5, 12))
    hook.close()
    (new,) = files(logdir / "exp")
    assert steps_in(new) == list(range(5, 12)), "every step logged after the removal, in the new file"
    assert f"{old} was removed while the run wrote it" in caplog_amp.text
    assert f"re-created as {new}" in caplog_amp.text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_removed_directory_that_cannot_be_re_created_keeps_the_steps(tmp_path, caplog_amp):
    logdir = tmp_path / "runs"
    hook = amp.VisualDLHook(logdir, run_name="exp", flush_every=5)
    log(hook, range(5))
    shutil.rmtree(logdir / "exp")
    logdir.chmod(0o500)
    log(hook, range(5, 10))
    assert hook._out.pending == 5 and "was removed and cannot be re-created" in caplog_amp.text
    logdir.chmod(0o700)
    log(hook, range(10, 15))
    hook.close()
    assert steps_in(files(logdir / "exp")[0]) == list(range(5, 15))
    assert hook.dropped_steps == 0


def test_a_removed_directory_that_mkdir_refuses_keeps_the_steps(tmp_path, caplog_amp, monkeypatch):
    """The same as the read-only parent above, also as root: mkdir refused (EACCES)."""
    logdir = tmp_path / "runs"
    hook = amp.VisualDLHook(logdir, run_name="exp", flush_every=5)
    log(hook, range(5))
    shutil.rmtree(logdir / "exp")
    real_mkdir = os.mkdir

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(records.os, "mkdir", refused)
    log(hook, range(5, 10))
    assert hook._out.pending == 5, "the steps wait in memory"
    assert "was removed and cannot be re-created ([Errno 13] Permission denied)" in caplog_amp.text
    monkeypatch.setattr(records.os, "mkdir", real_mkdir)
    log(hook, range(10, 15))
    hook.close()
    assert steps_in(files(logdir / "exp")[0]) == list(range(5, 15))
    assert hook.dropped_steps == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_after_opening_still_gets_every_step(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="exp", flush_every=5)
    (tmp_path / "exp").chmod(0o500)
    log(hook, range(12))
    hook.close()
    (tmp_path / "exp").chmod(0o700)
    assert steps_in(files(tmp_path / "exp")[0]) == list(range(12))


# ---------------------------------------------------------------- no cap, bounded backlog
def test_a_huge_flush_writes_every_step(tmp_path, caplog_amp):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    log(hook, range(20_000))
    hook.close()
    assert steps_in(files(tmp_path)[0]) == list(range(20_000))
    assert hook.dropped_steps == 0 and "could not" not in caplog_amp.text


def test_only_steps_whose_write_failed_are_bounded(tmp_path, caplog_amp, monkeypatch):
    from paddle_amp_ext.visualdl.writer import BatchedWriter

    monkeypatch.setattr(BatchedWriter, "MAX_BACKLOG", 30)
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10, flush_secs=math.inf)
    real = hook._out._file.write_bytes
    full = [True]

    def write(data):
        if full[0]:
            raise OSError(28, "No space left on device")
        real(data)

    monkeypatch.setattr(hook._out._file, "write_bytes", write)
    log(hook, range(50))
    assert hook._out.backlog == 30 and hook.dropped_steps == 20, "the oldest failed steps dropped, counted"
    full[0] = False
    log(hook, range(50, 100))  # room again: a healthy flush of any size writes everything
    hook.close()
    assert steps_in(hook._out.path) == list(range(20, 100))
    assert hook.dropped_steps == 20
    assert "20 steps could not be written" in caplog_amp.text


# ---------------------------------------------------------------- copies
def test_pickling_or_copying_a_hook_names_the_mistake(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="exp")
    message = (r"A VisualDLHook cannot be pickled or copied: it writes one run's open record file "
               r"\('.*exp'\).*remove the hook first \(scaler.remove_hook\(hook\)\) and give the copy its own "
               r"VisualDLHook; to save or restore a scaler, use scaler.state_dict\(\)")
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=message):
            attempt(hook)
    scaler = amp.GradScaler(hooks=[hook])
    with pytest.raises(TypeError, match=message):
        copy.deepcopy(scaler)
    log(hook, range(2))  # the original goes on
    hook.close()
    assert steps_in(files(tmp_path / "exp")[0]) == [0, 1]
    callback = amp.VisualDLCallback(tmp_path, run_name="cb")
    with pytest.raises(TypeError, match=r"A VisualDLCallback cannot be pickled or copied"):
        copy.deepcopy(callback)
    callback.close()


# ---------------------------------------------------------------- losses that are not one value
@pytest.mark.parametrize("loss, expected", [
    ([1.0, 2.0, 3.0, 6.0], 3.0),
    ([[1.0, 2.0], [3.0, 4.0]], 2.5),
    ([2.0, float("inf")], math.inf),
    ([], math.nan),
])
def test_a_loss_of_several_values_is_recorded_as_its_mean(tmp_path, caplog_amp, loss, expected):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=2)
    for step in range(3):
        hook.on_step(event(step, paddle.to_tensor(loss, dtype="float32")))
    hook.close()
    values = [v for _, v in series(files(tmp_path)[0])]
    assert len(values) == 3
    if math.isnan(expected):
        assert all(math.isnan(v) for v in values)
    else:
        assert values == [expected] * 3
    shape = list(paddle.to_tensor(loss, dtype="float32").shape)
    assert caplog_amp.text.count(f"the loss given to scale() has shape {shape}, not one value: amp/loss records its "
                                 "mean") == 1


def test_a_bfloat16_loss_is_recorded_by_value_not_by_its_bits(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=2)
    for step in range(2):
        hook.on_step(event(step, paddle.to_tensor([1.5], dtype="float32").astype("bfloat16")))
    hook.close()
    assert [v for _, v in series(files(tmp_path)[0])] == [1.5, 1.5]


def test_a_value_paddle_cannot_read_in_a_batch_is_read_alone(tmp_path, caplog_amp, monkeypatch):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=3)

    def refuse(*args, **kwargs):
        raise ValueError("stack refused")

    monkeypatch.setattr(paddle, "stack", refuse)
    log(hook, range(3))  # the flush never raises into the training loop
    monkeypatch.undo()
    hook.close()
    assert series(files(tmp_path)[0]) == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert "could not read the logged values in one batch (ValueError('stack refused'))" in caplog_amp.text


def test_a_scalar_loss_warns_nothing(tmp_path, caplog_amp):
    with amp.VisualDLHook(tmp_path, run_name="") as hook:
        hook.on_step(event(0, paddle.to_tensor([2.0])))
        hook.on_step(event(1, paddle.to_tensor(3.0)))
    assert "not one value" not in caplog_amp.text
    assert series(files(tmp_path)[0]) == [(0, 2.0), (1, 3.0)]


# ---------------------------------------------------------------- threads and forks
def test_the_flusher_and_the_training_thread_never_lose_or_repeat_a_step(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=97, flush_secs=0.005)
    log(hook, range(3000))
    hook.close()
    assert steps_in(files(tmp_path)[0]) == list(range(3000))
    for tag in HOST_TAGS:
        assert steps_in(files(tmp_path)[0], tag) == list(range(3000))


def test_hooks_in_several_threads_each_get_every_step(tmp_path):
    hooks = [amp.VisualDLHook(tmp_path, run_name=f"t{i}", flush_every=13, flush_secs=0.01) for i in range(4)]
    threads = [threading.Thread(target=log, args=(hook, range(500))) for hook in hooks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for hook in hooks:
        hook.close()
    for i in range(4):
        assert steps_in(files(tmp_path / f"t{i}")[0]) == list(range(500))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_writes_the_parents_steps_even_with_the_flusher(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=0.05)
    from paddle_amp_ext.visualdl import shutdown

    with shutdown._lock:  # the fork happens while a flush would hold the lock: the child's lock is new
        log(hook, range(3))
        pid = os.fork()
        if pid == 0:
            try:
                log(hook, range(3, 6))
                time.sleep(0.3)  # several flusher periods: the child has no flusher
                hook.flush()
                hook.close()
            finally:
                os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    hook.close()
    assert steps_in(files(tmp_path)[0]) == [0, 1, 2]


# ---------------------------------------------------------------- kills that run no Python
def start(what, logdir, n=0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), what, str(logdir), str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(proc, prefix, timeout=120) -> list:
    lines, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith(prefix) or time.monotonic() > deadline:
            break
    return lines


def finish(proc, timeout=120) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


BOUND = 0.5  # the children's flush_secs


@pytest.mark.parametrize("how", ["sigkill", "sigabrt"])
def test_a_kill_that_runs_no_python_keeps_every_step_older_than_the_bound(tmp_path, how):
    proc = start("idle" if how == "sigkill" else "abort", tmp_path, 400)
    try:
        assert wait_for(proc, "logged")[-1] == "logged", proc.stderr.read()[-2000:]
        if how == "sigkill":
            time.sleep(BOUND * 3)
            proc.send_signal(signal.SIGKILL)
    finally:
        code = finish(proc)
    assert code == (-signal.SIGKILL if how == "sigkill" else -signal.SIGABRT)
    (path,) = files(tmp_path)
    for tag in ["amp/loss", *HOST_TAGS]:
        assert steps_in(path, tag) == list(range(400)), tag
    assert [v for _, v in series(path)] == [float(s) for s in range(400)]


def test_a_kill_in_the_middle_of_training_keeps_every_step_older_than_the_bound(tmp_path):
    proc = start("busy", tmp_path)
    seen = []  # (step, when this process read its line): the step had finished by then
    try:
        for line in proc.stdout:
            seen.append((int(line.split()[1]), time.monotonic()))
            if seen[-1][1] - seen[0][1] > BOUND * 8 and seen[-1][0] > 100:
                break
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
    finally:
        finish(proc)
    (path,) = files(tmp_path)
    recorded = steps_in(path)
    assert recorded == list(range(len(recorded))), "a prefix, every record whole"
    # the slack: a write's own time, and a machine whose 2 cores run several test suites at once
    old_enough = [step for step, when in seen if killed_at - when > BOUND + 2.0]
    assert old_enough, "the child ran for several bounds"
    assert len(recorded) > old_enough[-1], (len(recorded), old_enough[-1], "every step older than the bound")


def test_host_values_reach_the_file_while_the_device_never_answers(tmp_path):
    proc = start("hung_device", tmp_path, 50)
    try:
        assert wait_for(proc, "logged")[-1] == "logged", proc.stderr.read()[-2000:]
        time.sleep(BOUND * 3)
        proc.send_signal(signal.SIGKILL)
    finally:
        finish(proc)
    (path,) = files(tmp_path)
    for tag in HOST_TAGS:
        assert steps_in(path, tag) == list(range(50)), tag
    assert steps_in(path, "amp/loss") == [], "the device values were never read"


# ---------------------------------------------------------------- signals
@pytest.mark.parametrize("handler, queued", [("script's", 9000), ("ours", 0)])
def test_a_keyboard_interrupt_in_the_middle_of_a_flush_loses_no_step(tmp_path, handler, queued):
    proc = start("interrupt_in_flush" + ("_ours" if handler == "ours" else ""), tmp_path, 9000)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]
    # the script's handler raises inside the flush: every step stays queued; ours waits for the flush
    assert f"interrupted {queued}" in out
    assert steps_in(files(tmp_path / "x")[0]) == list(range(9000)), "and the exit wrote them, once each"


def sigint_child(tmp_path, what) -> tuple:
    proc = start(what, tmp_path / "runs")
    try:
        lines = wait_for(proc, "step 80")
        proc.send_signal(signal.SIGINT)
        lines += [line.strip() for line in proc.stdout]  # the lines already buffered in proc.stdout too
        err = proc.stderr.read()
    finally:
        code = finish(proc)
    return code, lines, err


@pytest.mark.parametrize("what", ["sigint_ocr_before", "sigint_ocr_after", "sigint_default"])
def test_ctrl_c_keeps_every_step_before_the_scripts_own_handler_runs(tmp_path, what):
    code, lines, err = sigint_child(tmp_path, what)
    printed = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    if what == "sigint_default":
        assert code == 130, err[-2000:]
        assert lines[-1] in (f"interrupted at {printed[-1]}", f"interrupted at {printed[-1] + 1}"), \
            "Python's KeyboardInterrupt, after the flush (maybe between a step's update() and its print)"
    else:
        assert code == -signal.SIGKILL, err[-2000:]
        assert lines[-1] == "ocr handler", "the script's handler still runs (and kills its process group)"
    (run,) = glob.glob(str(tmp_path / "runs" / "*"))
    recorded = steps_in(files(run)[0])
    assert recorded == list(range(len(recorded)))
    assert len(recorded) - (printed[-1] + 1) in (0, 1), "every step whose update() returned"


@pytest.mark.parametrize("what, expected", [
    ("chains_back", ["script handler", "KeyboardInterrupt", "written True"]),
    ("ignored", ["still running", "written False"]),
])
def test_a_handler_installed_after_the_hook_is_wrapped_without_a_loop(tmp_path, what, expected):
    proc = start(what, tmp_path, 7)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert out.split("\n")[-len(expected) - 1:-1] == expected
    assert out.count("script handler") == (1 if what == "chains_back" else 0), "called once: no loop"
    if what == "chains_back":  # flushed by our handler before the script's ran
        assert steps_in(files(tmp_path)[0]) == list(range(7))
