"""The record writer against hostile values, kills, races and forks: values
beyond float32's range, negative steps, a SIGKILL in the middle of a large write, hooks started
together with one run name, steps logged in a forked child, a multiprocessing child's own hook,
and the learning rate on skipped steps. Every record is read back with VisualDL's own LogReader."""

from __future__ import annotations

import glob
import math
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.events import StepEvent, StepResult
from paddle_amp_ext.visualdl import records

pytest.importorskip("visualdl")
from visualdl import LogReader  # noqa: E402
from visualdl.proto import record_pb2  # noqa: E402

F32_MAX = float(np.finfo(np.float32).max)
#: the smallest float64 that rounds to float32 inf (float32's largest plus half its last step)
F32_INF_FROM = F32_MAX + 2.0**103


def event(step, loss=None, lr=0.5):
    return StepEvent(step, loss, StepResult(False, 1024.0), lr, 1024.0)


def the_file(directory) -> str:
    (path,) = glob.glob(os.path.join(str(directory), "vdlrecords.*"))
    return path


def series(path, tag="amp/loss") -> list:
    return [(d.id, d.value) for d in LogReader(file_path=str(path)).get_data("scalar", tag)]


def protobuf_record(step, tag, value, walltime_ms) -> bytes:
    """What VisualDL's own LogWriter writes for one scalar: its uint64 length and the Record."""
    body = record_pb2.Record(values=[record_pb2.Record.Value(id=step, tag=tag, timestamp=walltime_ms,
                                                             value=value)]).SerializeToString()
    return len(body).to_bytes(8, "little") + body


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


# ---------------------------------------------------------------- values of any float dtype (finding 2)
@pytest.mark.parametrize("value", [1e39, -1e39, F32_INF_FROM, -F32_INF_FROM, F32_MAX, -F32_MAX, 1e308, 10**400,
                                   -(10**400), math.inf, -math.inf, 1e-50, -0.0, 5e-324, np.float64(1e39),
                                   np.float16(65504), np.longdouble(1e39)], ids=lambda v: repr(v)[:24])
def test_every_value_is_encoded_as_visualdls_own_protobuf_stores_it(value):
    as_float = (math.inf if value > 0 else -math.inf) if isinstance(value, int) else float(value)
    assert records.ScalarEncoder().step(3, 1700, [("amp/loss", value)]) == \
        protobuf_record(3, "amp/loss", as_float, 1700)


@pytest.mark.parametrize("value", ["1.0", None, object()])
def test_a_value_that_is_not_a_number_is_refused_by_the_encoder(value):
    with pytest.raises(TypeError, match=r"A recorded value must be a real number. Received: .* \(of type "):
        records.ScalarEncoder().step(3, 1700, [("amp/loss", value)])


def test_nan_is_encoded_as_a_float32_nan():
    encoded = records.ScalarEncoder().step(3, 1700, [("amp/loss", math.nan)])
    assert encoded[:-4] == protobuf_record(3, "amp/loss", math.nan, 1700)[:-4]
    assert math.isnan(np.frombuffer(encoded[-4:], "<f4")[0])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("where", ["device", "host"])
def test_a_loss_beyond_float32s_range_is_recorded_as_inf_on_every_step(tmp_path, caplog_amp, dtype, where):
    big = 1e39 if dtype == "float64" else math.inf  # the largest each dtype holds beyond float32's range
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=7)
    for step in range(60):
        value = big if step % 2 else -big
        loss = paddle.to_tensor(value, dtype=dtype) if where == "device" else value
        hook.on_step(event(step, loss, lr=1e39))
    hook.close()
    assert series(the_file(tmp_path)) == [(s, math.inf if s % 2 else -math.inf) for s in range(60)]
    assert series(the_file(tmp_path), "amp/lr") == [(s, math.inf) for s in range(60)]
    assert hook.dropped_steps == 0 and "could not" not in caplog_amp.text


@pytest.mark.parametrize("lr", ["0.1", object(), [0.1]])
@pytest.mark.parametrize("flush", ["steps", "background"])
def test_a_value_that_is_no_number_is_recorded_as_nan_and_never_stops_the_flushes(tmp_path, caplog_amp, lr, flush):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=2 if flush == "steps" else 10**6, flush_secs=0.05)
    for step in range(5):
        hook.on_step(event(step, paddle.to_tensor(float(step)), lr=lr if step == 1 else 0.5))
    deadline = time.monotonic() + 60
    while flush == "background" and hook._out.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hook._out.pending == 0 or flush == "steps" and hook._out.pending == 1
    hook.close()
    lrs = series(the_file(tmp_path), "amp/lr")
    assert [s for s, _ in lrs] == list(range(5)) and math.isnan(lrs[1][1])
    assert [v for s, v in lrs if s != 1] == [0.5] * 4
    assert series(the_file(tmp_path)) == [(s, float(s)) for s in range(5)]
    assert "A recorded value must be a real number. Received: " in caplog_amp.text
    assert caplog_amp.text.count("recorded as NaN") == 1 and hook.dropped_steps == 0


# ---------------------------------------------------------------- steps (finding 17)
@pytest.mark.parametrize("step", [-1, -(2**70), 2**63])
def test_a_step_out_of_int64_range_is_refused_naming_it_and_nothing_hangs(tmp_path, step):
    proc = run_python(f"""
        import glob, paddle, paddle_amp_ext as amp
        from paddle_amp_ext.events import StepEvent, StepResult
        from visualdl import LogReader
        hook = amp.VisualDLHook({str(tmp_path)!r}, run_name="", flush_every=3, flush_secs=0.05)
        ok = lambda s: StepEvent(s, paddle.to_tensor(float(s)), StepResult(False, 1.0), 0.1, 1.0)
        hook.on_step(ok(0))
        try:
            hook.on_step(ok({step}))
        except ValueError as exc:
            print("refused:", exc)
        for s in (1, 2, 3):
            hook.on_step(ok(s))
        hook.close()
        (path,) = glob.glob({str(tmp_path)!r} + "/vdlrecords.*")
        print([d.id for d in LogReader(file_path=path).get_data("scalar", "amp/loss")])
    """, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"refused: StepEvent.step must be an int from 0 to 9223372036854775807 (the 0-based iteration "
                        f"VisualDL plots on its x axis, an int64). Received: step={step}. Count iterations from 0.")
    assert lines[1] == "[0, 1, 2, 3]"


@pytest.mark.parametrize("step", [True, 1.0, "3", None, paddle.to_tensor(3)])
def test_a_step_that_is_not_an_int_is_refused_naming_its_type(tmp_path, step):
    with amp.VisualDLHook(tmp_path, run_name="") as hook:
        with pytest.raises(TypeError, match=r"(?s)StepEvent.step must be an int >= 0 .* Received: step=.* \(of type "):
            hook.on_step(event(step, 1.0))
        hook.on_step(event(np.int64(4), 1.0))  # any integral type
    assert series(the_file(tmp_path)) == [(4, 1.0)]


@pytest.mark.parametrize("value", [0, 1, 127, 128, 255, 256, 16383, 16384, 2**63 - 1, -1, -128, -(2**63)])
def test_varint_is_protobufs_int64_encoding_for_every_int(value):
    expected = record_pb2.Record.Value(id=value).SerializeToString()
    assert b"\x08" + records._varint(value) == expected if value else expected == b""
    assert records._varint(-1) == b"\xff" * 9 + b"\x01"


def test_each_steps_loss_scale_is_recorded_when_it_changes_or_repeats(tmp_path):
    """The hook keeps the last scale's rows: a change of value, of sign (0.0 / -0.0) or of type
    (int / float), a NaN or a non-positive scale never reuses the previous step's rows."""
    scales = [8.0, 8.0, 4.0, 0.0, -0.0, -0.0, math.nan, math.nan, 8, 8.0, math.inf, 2.0**-3, 2.0**-3]
    with amp.VisualDLHook(tmp_path, run_name="") as hook:
        for step, scale in enumerate(scales):
            hook.on_step(StepEvent(step, None, StepResult(False, scale), 0.5, scale))
    raw = series(the_file(tmp_path), "amp/loss_scale")
    log2 = series(the_file(tmp_path), "amp/log2_loss_scale")
    assert [s for s, _ in raw] == [s for s, _ in log2] == list(range(len(scales)))
    for (_, got), want in zip(raw, scales):
        assert (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))
    # a scale that is not > 0 (NaN too) has log2 -inf
    assert [v for _, v in log2] == [3.0, 3.0, 2.0] + [-math.inf] * 5 + [3.0, 3.0, math.inf, -3.0, -3.0]


# ---------------------------------------------------------------- a torn record (finding 8)
TORN_CHILD = """
    import os, signal, paddle, paddle_amp_ext as amp
    from paddle_amp_ext.events import StepEvent, StepResult
    ev = lambda s: StepEvent(s, paddle.to_tensor(float(s)), StepResult(False, 1.0), 0.1, 1.0)
    hook = amp.VisualDLHook({logdir!r}, run_name="", flush_every=10**9, flush_secs=float("inf"))
    for s in range(100):
        hook.on_step(ev(s))
    hook.flush()  # 100 whole steps in the file
    for s in range(100, 20100):
        hook.on_step(ev(s))
    real = os.write
    def stopped_at_a_page(fd, data):  # Linux stops a large write() at a page boundary when SIGKILL comes
        if len(data) > 65536:
            real(fd, bytes(data)[:3 * 4096])
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, data)
    os.write = stopped_at_a_page
    hook.flush()
"""


def killed_in_the_middle_of_a_large_write(logdir) -> str:
    proc = run_python(TORN_CHILD.format(logdir=str(logdir)))
    assert proc.returncode == -9, proc.stderr[-3000:]
    return the_file(logdir)


def whole_steps(path) -> list:
    return [s for s, _ in series(path)]


def test_a_torn_record_file_is_repaired_for_visualdls_reader(tmp_path, caplog_amp):
    path = killed_in_the_middle_of_a_large_write(tmp_path)
    size = os.path.getsize(path)
    with pytest.raises(Exception, match="Error parsing message"):  # VisualDL rejects the torn file whole
        series(path)
    assert records.repair_records(str(tmp_path)) == [path]
    steps = whole_steps(path)
    assert steps[:100] == list(range(100)) and steps == list(range(len(steps))), "a prefix, every record whole"
    assert len(steps) > 100, "the whole records of the torn write are kept"
    assert f"{path} ended in a partial record" in caplog_amp.text
    assert f"({size - os.path.getsize(path)} bytes removed)" in caplog_amp.text
    assert records.repair_records(str(tmp_path)) == [], "whole now: nothing to cut"


def test_a_hook_opening_in_the_directory_repairs_a_torn_file(tmp_path, caplog_amp):
    path = killed_in_the_middle_of_a_large_write(tmp_path)
    with amp.VisualDLHook(tmp_path, run_name="") as hook:
        hook.on_step(event(0, 1.0))
    assert whole_steps(path)[:100] == list(range(100))
    assert f"VisualDL records: {path} ended in a partial record" in caplog_amp.text


def test_visualdl_serve_repairs_before_serving(tmp_path):
    path = killed_in_the_middle_of_a_large_write(tmp_path / "run")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = run_python(f"""
        import os, sys
        os.execv = lambda *args: sys.exit(0)  # the dashboard itself is not started
        from paddle_amp_ext.cli.visualdl_serve import main
        sys.exit(main(["--logdir", {str(tmp_path)!r}, "--port", "{port}"]))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"repaired {path}: it ended in a partial record" in proc.stderr
    assert whole_steps(path)[:100] == list(range(100))


def test_a_file_a_live_hook_writes_is_never_cut(tmp_path):
    with amp.VisualDLHook(tmp_path, run_name="") as hook:
        hook.on_step(event(0, 1.0))
        hook.flush()
        with open(hook._out.path, "ab") as half:  # as if its own write were half done right now
            half.write(b"\x40\x00\x00")
        size = os.path.getsize(hook._out.path)
        assert records.repair_records(str(tmp_path)) == []
        assert os.path.getsize(hook._out.path) == size


@pytest.mark.parametrize("entry", ["link", "fifo", "directory", "empty", "not_records", "torn_meta"])
def test_repair_leaves_what_is_not_a_torn_regular_file_alone(tmp_path, entry):
    target = tmp_path / "outside"
    target.write_bytes(b"\x05")  # a partial record if it were followed
    name = tmp_path / "logs" / "vdlrecords.1.log"
    name.parent.mkdir()
    {"link": lambda: name.symlink_to(target), "fifo": lambda: os.mkfifo(name), "directory": name.mkdir,
     "empty": lambda: name.write_bytes(b""), "not_records": lambda: name.write_bytes(b"someone else's file"),
     "torn_meta": lambda: name.write_bytes(records.meta_record(1)[:20])}[entry]()
    before = name.read_bytes() if entry in ("empty", "not_records", "torn_meta") else None
    assert records.repair_records(str(tmp_path / "logs")) == []
    assert target.read_bytes() == b"\x05"
    if before is not None:
        assert name.read_bytes() == before, "not a record file VisualDL could read anyway: not ours to cut"


# ---------------------------------------------------------------- hooks started together (finding 11)
@pytest.fixture
def slow_check(monkeypatch):
    """A file system slow to answer: the check for records waits, widening any check-then-create window."""
    from paddle_amp_ext.visualdl import hook as hook_module

    check = hook_module._has_records

    def slow(path):
        found = check(path)
        time.sleep(0.05)
        return found

    monkeypatch.setattr(hook_module, "_has_records", slow)


def test_hooks_started_together_in_threads_never_share_a_run(tmp_path, slow_check):
    barrier, hooks = threading.Barrier(6), []

    def start():
        barrier.wait()
        hooks.append(amp.VisualDLHook(tmp_path, run_name="exp"))

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for hook in hooks:
        hook.on_step(event(0, 1.0))
        hook.close()
    assert sorted(os.path.basename(hook.logdir) for hook in hooks) == ["exp", *(f"exp-{n}" for n in range(1, 6))]
    assert all(len(glob.glob(os.path.join(hook.logdir, "vdlrecords.*"))) == 1 for hook in hooks)


def test_hooks_started_together_in_processes_never_share_a_run(tmp_path):
    start_at = time.time() + 8  # every child imported paddle by then
    code = f"""
        import time, paddle_amp_ext as amp
        from paddle_amp_ext.visualdl import hook as hook_module
        check = hook_module._has_records
        hook_module._has_records = lambda path: (check(path), time.sleep(0.05))[0]
        time.sleep(max(0.0, {start_at} - time.time()))
        print(amp.VisualDLHook({str(tmp_path)!r}, run_name="exp").logdir)
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
             for _ in range(4)]
    try:
        outs = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    assert sorted(os.path.basename(out.strip().splitlines()[-1]) for out, _ in outs) == ["exp", "exp-1", "exp-2",
                                                                                         "exp-3"]
    assert all(len(glob.glob(str(tmp_path / name / "vdlrecords.*"))) == 1 for name in ("exp", "exp-1", "exp-2"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_hook_was_being_created_never_blocks_later_hooks(tmp_path):
    with records.creating_in(str(tmp_path)):  # another thread forks a long-lived worker right now
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
    try:
        made = []
        later = threading.Thread(target=lambda: made.append(amp.VisualDLHook(tmp_path, run_name="later")))
        later.start()
        later.join(30)
        assert made and not later.is_alive(), "the child holds no copy of the creation lock"
        made[0].close()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


# ---------------------------------------------------------------- forks (findings 18 and 3)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_keeps_no_queue_and_says_why_once(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    hook.on_step(event(0, 1.0))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import logging

            seen = []
            handler = logging.Handler()
            handler.emit = lambda record: seen.append(record.getMessage())
            logging.getLogger("paddle_amp_ext").addHandler(handler)
            for step in range(1, 5001):
                hook.on_step(event(step, 1.0))
            pending = hook._out.pending
            hook.close()
            os.write(write, repr((pending, seen)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        pending, seen = eval(pipe.read())  # noqa: S307 - our own child's repr
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert pending == 0, "nothing queued in the child"
    assert seen == [f"VisualDL hook: steps logged in process {pid}, a fork of process {os.getpid()} that owns "
                    f"{hook._out.path}, are not recorded (the parent writes that file; a copy in the child would "
                    "interleave with it). Create the hook in the child for records of its own."], "one warning, no full disk"
    hook.on_step(event(1, 2.0))
    hook.close()
    assert series(the_file(tmp_path)) == [(0, 1.0), (1, 2.0)], "the parent's file is whole and still its own"


_KEPT = []  # what holds the child's hook to its end (a scaler held by the script, or `run`'s session)


def _child_with_its_own_hook(logdir: str) -> None:
    _KEPT.append(amp.VisualDLHook(logdir, run_name="child"))  # never closed: the child ends as a script would
    for step in range(20):
        _KEPT[0].on_step(event(step, float(step)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_fork_started_multiprocessing_child_keeps_the_records_of_its_own_hook(tmp_path):
    parent = amp.VisualDLHook(tmp_path, run_name="parent", flush_secs=math.inf)
    parent.on_step(event(0, 7.0))
    child = multiprocessing.get_context("fork").Process(target=_child_with_its_own_hook, args=(str(tmp_path),))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert series(the_file(tmp_path / "child")) == [(s, float(s)) for s in range(20)]
    parent.close()
    assert series(the_file(tmp_path / "parent")) == [(0, 7.0)]


# ---------------------------------------------------------------- amp/lr on skipped steps
def test_the_lr_is_recorded_on_every_step_skipped_ones_first(tmp_path):
    paddle.seed(0)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=paddle.optimizer.lr.StepDecay(0.5, step_size=1, gamma=0.5),
                               parameters=model.parameters())
    hook = amp.VisualDLHook(tmp_path, run_name="")
    scaler = amp.GradScaler(init_loss_scaling=1024, hooks=[hook])
    for step in range(6):
        scaler.scale(model(paddle.ones([2, 4])).mean()).backward()
        if step in (0, 1, 4):
            model.weight.grad.set_value(paddle.full_like(model.weight.grad, math.inf))
        scaler.step(opt)
        scaler.update()
        scaler.step_scheduler(opt._learning_rate)
        opt.clear_grad()
    hook.close()
    assert series(the_file(tmp_path), "amp/skipped_steps") == [(0, 1.0), (1, 2.0), (2, 2.0), (3, 2.0), (4, 3.0),
                                                              (5, 3.0)]
    assert series(the_file(tmp_path), "amp/lr") == [(0, 0.5), (1, 0.5), (2, 0.5), (3, 0.25), (4, 0.125), (5, 0.125)]


RUN_FORK_SCRIPT = """
import multiprocessing as mp
import paddle

def train():
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
    for _ in range(20):
        scaler.scale(model(paddle.ones([2, 4])).mean()).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()

if __name__ == "__main__":
    child = mp.get_context("fork").Process(target=train)
    child.start()
    child.join()
    assert child.exitcode == 0, child.exitcode
"""


@pytest.mark.slow
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_run_keeps_the_records_of_a_fork_started_child_that_trains(tmp_path):
    """`run`'s hook for the child's scaler is made in the child (at its first step) and held by the
    run session to the end: the child's normal end (os._exit) still closes it."""
    (tmp_path / "script.py").write_text(RUN_FORK_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--logdir", "runs", "script.py"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = glob.glob(str(tmp_path / "runs" / "*" / "vdlrecords.*"))
    assert [s for s, _ in series(path, "amp/loss_scale")] == list(range(20))
