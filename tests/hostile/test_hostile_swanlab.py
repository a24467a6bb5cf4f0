"""SwanLab's offline run file against hostile input and events: values that are no numbers or not
finite, steps SwanLab would not keep, a run directory removed mid-run, failed writes, forks,
threads, and no SwanLab import on the write path."""

from __future__ import annotations

import errno
import math
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
from dashboard_readers import leveldb_payloads, read_swanlab, read_visualdl, swanlab_records

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import metrics
from paddle_amp_ext.dashboards import swanlab_file as sf
from paddle_amp_ext.visualdl.writer import BatchedWriter

LOSS = metrics.LOSS.name


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.delenv("SWANLAB_MODE", raising=False)


def _records(data: bytes) -> list:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    return [Record.FromString(r) for r in leveldb_payloads(b":W&B" + data[4:])]


def test_steps_swanlab_would_not_keep_are_left_out_warned_once(caplog):
    pytest.importorskip("swanlab")
    encoder, sequence = sf.ScalarEncoder(), sf.Sequence()
    steps = [encoder.step(s, 1000, [(LOSS, float(s))]) for s in (-1, 0, 0, 5, 3, 2**48 + 1, 2**48, 7)]
    data, state = sequence.encode(steps, len(sf.MAGIC))
    sequence.commit(state)
    records = _records(sf.MAGIC + data)
    assert [r.scalar.step for r in records if r.HasField("scalar")] == [0, 5, 2**48]
    assert [r.num for r in records] == [1, 2, 3, 4] and records[0].HasField("column")
    assert caplog.text.count("is not above its last step") == 1
    # a key's own last step: a new key may start at an earlier step than the others
    data, state = sequence.encode([encoder.step(4, 1000, [("other", 1.0)])], 0)
    assert [r.scalar.step for r in _records(sf.MAGIC + data) if r.HasField("scalar")] == [4]


@pytest.mark.parametrize("value, number", [(np.float32(0.25), 0.25), (np.float64(-2.0), -2.0), (True, 1.0), (3, 3.0),
                                           (10**400, math.inf), (-(10**400), -math.inf), (math.nan, math.nan),
                                           (-0.0, -0.0), (1e-310, 1e-310)])
def test_every_real_kind_is_stored_as_swanlabs_double(value, number):
    pytest.importorskip("swanlab")
    sequence = sf.Sequence()
    data, _ = sequence.encode([sf.ScalarEncoder().step(0, 0, [(LOSS, value)])], len(sf.MAGIC))
    stored = _records(sf.MAGIC + data)[1].scalar.value.number
    assert str(stored) == str(number) and math.copysign(1, stored) == math.copysign(1, number)


@pytest.mark.parametrize("value", ["1.0", None, [1.0], object(), b"1", 1j])
def test_a_value_that_is_no_real_number_is_refused(value):
    with pytest.raises(TypeError, match="A recorded value must be a real number. Received: "):
        sf.ScalarEncoder().step(0, 0, [(LOSS, value)])


def test_empty_steps_and_no_steps_write_nothing():
    sequence = sf.Sequence()
    assert sequence.encode([], 7)[0] == b""
    assert sequence.encode([sf.ScalarEncoder().step(0, 0, [])], 7)[0] == b""


def _hook(tmp_path, **kwargs):
    kwargs.setdefault("run_name", "exp")
    return amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "swanlab"], **kwargs)


def _log(hook, steps, value=lambda s: float(s)):
    import paddle

    from paddle_amp_ext.events import StepEvent, StepResult

    for step in steps:
        hook.on_step(StepEvent(step, paddle.to_tensor(value(step)), StepResult(False, 8.0), 0.1, 8.0))


def test_nan_inf_repeated_and_huge_steps_through_the_hook(tmp_path):
    pytest.importorskip("swanlab")
    values = {0: math.nan, 1: math.inf, 2: -math.inf, 3: 1e39}
    hook = _hook(tmp_path, flush_every=3)
    _log(hook, [0, 1, 2, 2, 3, 2**48, 2**62], lambda s: values.get(s, 1.0))
    hook.close()
    data = read_swanlab(hook.logdir)
    assert [s for s, _ in data[LOSS]] == [0, 1, 2, 3, 2**48]  # the repeated 2 and a step past 2**48: not in SwanLab
    assert str([v for _, v in data[LOSS]]) == str([math.nan, math.inf, -math.inf, math.inf, 1.0])  # 1e39: float32 loss
    assert [s for s, _ in read_visualdl(hook.logdir)[LOSS]] == [0, 1, 2, 2, 3, 2**48, 2**62]  # VisualDL has them all


def test_run_directory_removed_mid_run_is_recreated_as_the_same_run(tmp_path, caplog):
    pytest.importorskip("swanlab")
    hook = _hook(tmp_path, flush_every=2, flush_secs=math.inf)
    _log(hook, range(4))
    first = swanlab_records(hook.logdir)
    shutil.rmtree(tmp_path / "runs")
    _log(hook, range(4, 8))
    hook.close()
    records = swanlab_records(hook.logdir)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds[:3] == ["start", "save", "column"] and kinds[-1] == "finish"
    assert records[0].start.id == first[0].start.id and records[0].start.started_at == first[0].start.started_at
    assert [r.num for r in records if r.num > 0] == list(range(1, sum(r.num > 0 for r in records) + 1))
    assert [s for s, _ in read_swanlab(hook.logdir)[LOSS]] == [4, 5, 6, 7]
    assert len(list((tmp_path / "runs" / "exp").glob("run-*/files/swanlab-metadata.json"))) == 1
    assert "was removed while the run wrote it" in caplog.text


def test_a_failed_write_is_cut_back_and_retried_with_the_same_numbers(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    hook = _hook(tmp_path, flush_every=3, flush_secs=math.inf)
    out = [o for o in hook._outs if o.backend == "swanlab"][0]
    real, calls = os.write, []

    def full(fd, data):
        if fd == out._file._fd and not calls:
            calls.append(len(data))
            real(fd, bytes(data)[:10])  # a torn write: the file is cut back to its last whole record
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    _log(hook, range(3))
    assert out.backlog == 3 and calls
    _log(hook, range(3, 6))
    hook.close()
    records = swanlab_records(hook.logdir)
    positive = [r.num for r in records if r.num > 0]
    assert positive == list(range(1, len(positive) + 1))
    assert [s for s, _ in read_swanlab(hook.logdir)[LOSS]] == list(range(6))
    assert hook.dropped_steps == 0


def test_a_forked_child_never_writes_the_parents_run_end(tmp_path):
    pytest.importorskip("swanlab")
    hook = _hook(tmp_path, flush_every=2, flush_secs=math.inf)
    _log(hook, range(2))
    pid = os.fork()
    if pid == 0:  # a DataLoader worker exiting through the same objects
        try:
            _log(hook, [10])
            hook.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    _log(hook, range(2, 4))
    hook.close()
    kinds = [r.WhichOneof("record_type") for r in swanlab_records(hook.logdir)]
    assert kinds.count("finish") == 1 and kinds[-1] == "finish"
    assert [s for s, _ in read_swanlab(hook.logdir)[LOSS]] == [0, 1, 2, 3]


def test_threads_flushing_while_steps_arrive_keep_every_step_once_in_order(tmp_path):
    pytest.importorskip("swanlab")
    writer = BatchedWriter(str(tmp_path), flush_every=7, flush_secs=0.005, run_parts=["exp"], backend="swanlab")
    stop = threading.Event()

    def flushing():
        while not stop.is_set():
            writer.flush()

    threads = [threading.Thread(target=flushing) for _ in range(3)]
    for t in threads:
        t.start()
    for step in range(2000):
        writer.add(step, 1_700_000_000_000 + step, [(LOSS, float(step)), ("amp/x", -float(step))])
    stop.set()
    for t in threads:
        t.join()
    writer.close()
    records = swanlab_records(str(tmp_path))
    positive = [r.num for r in records if r.num > 0]
    assert positive == list(range(1, len(positive) + 1))
    assert read_swanlab(str(tmp_path)) == {LOSS: [(s, float(s)) for s in range(2000)],
                                           "amp/x": [(s, -float(s)) for s in range(2000)]}
    assert os.path.getsize(writer.path) > 4 * 32768  # many block boundaries crossed


def test_the_write_path_never_imports_swanlab(tmp_path):
    script = ("import sys, paddle_amp_ext as amp\n"
              "from paddle_amp_ext.events import StepEvent, StepResult\n"
              f"hook = amp.VisualDLHook({str(tmp_path)!r}, report_to=['swanlab'], run_name='r')\n"
              "hook.on_step(StepEvent(0, 0.5, StepResult(False, 8.0), None, 8.0))\n"
              "hook.close()\n"
              "assert 'swanlab' not in sys.modules, 'swanlab imported'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    env.pop("SWANLAB_MODE", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "r").glob("run-*/run-*.swanlab"))
