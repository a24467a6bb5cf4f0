"""W&B's offline run file against hostile input and events: chunks at every place in a block,
records longer than a block, values that are no numbers or not finite, steps W&B would drop,
a run directory removed mid-run, failed writes, forks and threads."""

from __future__ import annotations

import errno
import math
import os
import shutil
import threading
import zlib

import numpy as np
import pytest
from dashboard_readers import history_items, leveldb_payloads, read_wandb, wandb_records

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import metrics
from paddle_amp_ext.dashboards import wandb_file as wf
from paddle_amp_ext.visualdl.writer import BatchedWriter

LOSS = metrics.LOSS.name


def _chunks(data: bytes, offset: int):
    """(block offset, type, length) of each chunk of a framed record written at ``offset``."""
    out, pos = [], 0
    while pos < len(data):
        at = (offset + pos) % wf.BLOCK
        if at + 7 > wf.BLOCK:  # the zeros that end a block
            assert data[pos:pos + wf.BLOCK - at] == b"\0" * (wf.BLOCK - at)
            pos += wf.BLOCK - at
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        assert int.from_bytes(data[pos:pos + 4], "little") == zlib.crc32(chunk, zlib.crc32(bytes((kind,))))
        assert at + 7 + length <= wf.BLOCK
        out.append((at, kind, length))
        pos += 7 + length
    return out


@pytest.mark.parametrize("at", [7, wf.BLOCK - 8, wf.BLOCK - 7, wf.BLOCK - 6, wf.BLOCK - 1, wf.BLOCK])
@pytest.mark.parametrize("size", [0, 1, wf.BLOCK - 14, wf.BLOCK - 7, wf.BLOCK, 3 * wf.BLOCK + 5])
def test_frame_anywhere_in_a_block_reads_back_whole(at, size):
    record = bytes(range(256)) * (size // 256) + bytes(size % 256)
    data = wf.frame(record, at)
    chunks = _chunks(data, at)
    assert [k for _, k, _ in chunks] == ([1] if len(chunks) == 1 else [2] + [3] * (len(chunks) - 2) + [4])
    assert sum(n for _, _, n in chunks) == size
    before = [] if at == 7 else [b"\1" * (at - 14)]  # one record from the header up to ``at``
    head = wf.MAGIC + b"".join(wf.frame(r, 7) for r in before)
    assert len(head) == at
    assert list(leveldb_payloads(head + data)) == before + [record]


@pytest.mark.parametrize("value, text", [(0.5, "0.5"), (1e39, "1e+39"), (-0.0, "-0.0"), (math.inf, "Infinity"),
                                         (-math.inf, "-Infinity"), (math.nan, "NaN"), (3, "3.0"), (True, "1.0"),
                                         (np.float32(0.25), "0.25"), (np.float16(65504), "65504.0"),
                                         (2**80, "1.2089258196146292e+24"), (10**400, "Infinity"),
                                         (-10**400, "-Infinity")])
def test_json_number_of_every_real_kind(value, text):
    assert wf.json_number(value) == text


@pytest.mark.parametrize("value", ["1.0", None, [1.0], object(), b"1", 1j])
def test_json_number_refuses_what_is_not_a_real_number(value):
    with pytest.raises(TypeError, match=r"A recorded value must be a real number\. Received: "):
        wf.json_number(value)


def test_steps_wandb_would_drop_are_left_out_warned_once(caplog):
    info = wf.RunInfo("r", run_id="abcd1234", start_ms=0)
    encoder, sequence = wf.HistoryEncoder(info), wf.Sequence(info)
    steps = [encoder.step(s, 1000, [(LOSS, float(s))]) for s in (-1, 0, 0, 5, 3, 2**63, 2**63 - 1, 7)]
    data, state = sequence.encode(steps, len(wf.MAGIC))
    sequence.commit(state)
    records = list(leveldb_payloads(wf.MAGIC + data))
    from wandb.proto.wandb_internal_pb2 import Record

    parsed = [Record.FromString(r) for r in records]
    assert [r.history.step.num for r in parsed[:-1]] == [0, 5, 2**63 - 1]
    assert [r.num for r in parsed] == [3, 4, 5, 6] and parsed[-1].WhichOneof("record_type") == "summary"
    assert caplog.text.count("is not above the last step logged") == 1
    data, state = sequence.encode([encoder.step(8, 0, [])], 0)  # after 2**63-1 nothing fits
    assert data == b"" and state == (sequence.num, 2**63 - 1)


def _hook(tmp_path, **kwargs):
    kwargs.setdefault("run_name", "exp")
    return amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "wandb"], **kwargs)


def _log(hook, steps, value=lambda s: float(s)):
    import paddle

    from paddle_amp_ext.events import StepEvent, StepResult

    for step in steps:
        hook.on_step(StepEvent(step, paddle.to_tensor(value(step)), StepResult(False, 8.0), 0.1, 8.0))


def test_nan_inf_negative_and_huge_steps_through_the_hook(tmp_path):
    values = {0: math.nan, 1: math.inf, 2: -math.inf, 3: 1e39}
    hook = _hook(tmp_path, flush_every=3)
    with pytest.raises(ValueError, match="Received: step=-5"):  # the hook refuses it before any backend
        _log(hook, [-5])
    _log(hook, [0, 1, 2, 2, 3, 2**62], lambda s: values.get(s, 1.0))
    hook.close()
    data = read_wandb(hook.logdir)
    assert [s for s, _ in data[LOSS]] == [0, 1, 2, 3, 2**62]  # the repeated 2: not in W&B (its log() drops it)
    assert str([v for _, v in data[LOSS]]) == str([math.nan, math.inf, -math.inf, math.inf, 1.0])  # 1e39: a float32 loss
    assert [s for s, _ in read_wandb_vdl(hook.logdir)] == [0, 1, 2, 2, 3, 2**62]  # VisualDL has them all


def read_wandb_vdl(logdir):
    from dashboard_readers import read_visualdl

    return read_visualdl(logdir)[LOSS]


def test_run_directory_removed_mid_run_is_recreated_as_the_same_run(tmp_path, caplog):
    hook = _hook(tmp_path, flush_every=2, flush_secs=math.inf)
    _log(hook, range(4))
    first = wandb_records(hook.logdir)
    shutil.rmtree(tmp_path / "runs")
    _log(hook, range(4, 8))
    hook.close()
    records = wandb_records(hook.logdir)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds[:2] == ["header", "run"] and kinds[-1] == "exit"
    assert records[1].run.run_id == first[1].run.run_id and records[1].run.start_time == first[1].run.start_time
    assert [r.history.step.num for r in records if r.history.item] == [4, 5, 6, 7]
    assert "was removed while the run wrote it" in caplog.text


def test_a_failed_write_is_cut_back_and_retried_with_the_same_numbers(tmp_path, monkeypatch):
    hook = _hook(tmp_path, flush_every=3, flush_secs=math.inf)
    wandb_out = [o for o in hook._outs if o.backend == "wandb"][0]
    real, calls = os.write, []

    def full(fd, data):
        if fd == wandb_out._file._fd and not calls:
            calls.append(len(data))
            real(fd, bytes(data)[:10])  # a torn write: the file is cut back to its last whole record
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    _log(hook, range(3))
    assert wandb_out.backlog == 3 and calls
    _log(hook, range(3, 6))
    hook.close()
    records = wandb_records(hook.logdir)
    assert [r.num for r in records] == list(range(1, len(records) + 1))
    assert [r.history.step.num for r in records if r.history.item] == list(range(6))
    assert hook.dropped_steps == 0


def test_a_forked_child_never_writes_the_parents_run_end(tmp_path):
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
    kinds = [r.WhichOneof("record_type") for r in wandb_records(hook.logdir)]
    assert kinds.count("exit") == 1 and kinds[-1] == "exit"
    assert [s for s, _ in read_wandb(hook.logdir)[LOSS]] == [0, 1, 2, 3]


def test_threads_flushing_while_steps_arrive_keep_every_step_once_in_order(tmp_path):
    writer = BatchedWriter(str(tmp_path), flush_every=7, flush_secs=0.005, run_parts=["exp"], backend="wandb")
    stop = threading.Event()

    def flushing():
        while not stop.is_set():
            writer.flush()

    threads = [threading.Thread(target=flushing) for _ in range(3)]
    for t in threads:
        t.start()
    for step in range(2000):
        writer.add(step, 1_700_000_000_000 + step, [(LOSS, float(step))])
    stop.set()
    for t in threads:
        t.join()
    writer.close()
    records = wandb_records(str(tmp_path))
    assert [r.num for r in records] == list(range(1, len(records) + 1))
    history = [history_items(r) for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == list(range(2000))
    assert [h[LOSS] for h in history] == [float(s) for s in range(2000)]
    assert os.path.getsize(writer.path) > 4 * wf.BLOCK  # many block boundaries crossed


def test_the_flush_summary_holds_each_keys_latest_value_when_steps_log_different_tags():
    from wandb.proto.wandb_internal_pb2 import Record

    info = wf.RunInfo("r", run_id="abcd1234", start_ms=0)
    encoder, sequence = wf.HistoryEncoder(info), wf.Sequence(info)
    scale, lr = metrics.LOSS_SCALE.name, metrics.LR.name
    steps = [encoder.step(0, 1000, [(LOSS, 1.0), (scale, 8.0)]), encoder.step(1, 2000, [(LOSS, 2.0), (lr, 0.1)]),
             encoder.step(2, 3000, [(LOSS, 3.0)]), encoder.step(3, 4000, [(LOSS, 4.0)])]
    data, _ = sequence.encode(steps, len(wf.MAGIC))
    summary = Record.FromString(list(leveldb_payloads(wf.MAGIC + data))[-1])
    assert history_items(summary) == {LOSS: 4.0, scale: 8.0, lr: 0.1, "_step": 3, "_timestamp": 4.0, "_runtime": 4.0}


def test_a_repeated_value_reuses_its_item_and_every_item_is_wandbs_own():
    """The encoder's per-tag cache of the last nonzero value: repeats, -0.0 after 0.0 (equal, not
    the same text), NaN and inf (never equal to themselves or kept), the smallest subnormal, an
    int; each step's items equal W&B's protobuf HistoryItem for the value, as json.dumps writes it."""
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    import json

    info = wf.RunInfo("exp", run_id="abc12345", start_ms=1_699_999_999_875, host="node-1")
    encoder = wf.HistoryEncoder(info)
    values = [1.0, 1.0, 0.0, -0.0, -0.0, 0.0, math.nan, math.nan, math.inf, math.inf, -math.inf, 1.0, 5e-324,
              5e-324, 3, 3, 1.0, 65536.0, 65536.0]
    for step, value in enumerate(values):
        encoded = encoder.step(step, 1_700_000_000_000 + step, [("amp/loss_scale", value), ("amp/lr", 0.5)])
        text = {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, json.dumps(float(value)))
        text = "NaN" if value != value else text
        for item, (key, expected) in zip(encoded.items[:2], [("amp/loss_scale", text), ("amp/lr", "0.5")]):
            one = pb.HistoryRecord(item=[pb.HistoryItem(nested_key=[key], value_json=expected)])
            assert item == one.SerializeToString(), (step, value)  # the item as a field of its record
