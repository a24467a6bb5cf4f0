"""The dashboards: the metric registry, TensorBoard's event file, SwanLab's and W&B's offline runs,
each read back with the backend's own library."""

from __future__ import annotations

import io
import math
import os

import pytest
from dashboard_readers import read_swanlab, read_tensorboard, read_wandb

from paddle_amp_ext.dashboards import metrics
from paddle_amp_ext.dashboards import tensorboard as tb
from paddle_amp_ext.dashboards.library import StepValues

LOSS, SCALE = metrics.LOSS.name, metrics.LOSS_SCALE.name
STEPS = [(0, 1_700_000_000_000, [(LOSS, 0.5), (SCALE, 65536.0)]),
         (1, 1_700_000_000_250, [(LOSS, math.inf), (SCALE, 32768.0)]),
         (2, 1_700_000_000_500, [(LOSS, 0.25), (SCALE, 1e39)])]  # beyond float32: inf in 32-bit formats


def test_registry_names_are_unique_grouped_and_in_dashboard_order():
    assert metrics.NAMES == ("amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps",
                             "amp/grad_norm", "amp/lr")
    assert all(m.name == "amp/" + m.key for m in metrics.METRICS)
    assert metrics.metric("amp/loss_scale") is metrics.LOSS_SCALE
    assert [m.trainer_key for m in metrics.METRICS if m.trainer_key] == ["loss_scale", "skipped_steps", "grad_norm"]
    table = metrics.markdown_table().splitlines()  # the AMP metrics, then the FP8 family (tests/test_fp8_tags.py)
    assert len(table) == 2 + len(metrics.METRICS) + len(metrics.FP8_METRICS) and table[2].startswith("| `amp/loss` |")


def test_event_file_is_byte_identical_to_tensorboards_own_writer():
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    buf = io.BytesIO()
    writer = RecordWriter(buf)
    writer.write(event_pb2.Event(wall_time=1_700_000_000.125, file_version="brain.Event:2").SerializeToString())
    values = [(LOSS, 0.5), (metrics.LR.name, 0.0), (SCALE, -2.0)]
    for step in (0, 1, 300, 2**40, -2):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values])
        writer.write(event_pb2.Event(wall_time=1_700_000_000.5, step=step, summary=summary).SerializeToString())
    encoder = tb.EventEncoder()
    ours = tb.header(1_700_000_000_125) + b"".join(encoder.step(s, 1_700_000_000_500, values)
                                                    for s in (0, 1, 300, 2**40, -2))
    assert ours == buf.getvalue()


def test_table_crc32c_equals_the_c_extension():
    table = tb._table_crc32c()
    for data in (b"", b"a", b"123456789", bytes(range(256)) * 3):
        assert table(data) == tb.crc32c(data)
    assert table(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_event_file_read_by_tensorboards_event_accumulator(tmp_path):
    encoder = tb.EventEncoder()
    (tmp_path / tb.file_name()).write_bytes(tb.header(1_700_000_000_000) + b"".join(encoder.step(*s) for s in STEPS))
    data = read_tensorboard(str(tmp_path))
    assert data == {LOSS: [(0, 0.5), (1, math.inf), (2, 0.25)],
                    SCALE: [(0, 65536.0), (1, 32768.0), (2, math.inf)]}


def _through(run_class, tmp_path):
    run = run_class(str(tmp_path), "unit")
    encoder = StepValues()
    run.write([encoder.step(*s) for s in STEPS[:2]])
    run.write([encoder.step(*STEPS[2])])
    run.close()
    run.close()  # idempotent
    with pytest.raises(OSError, match="is finished"):
        run.write([encoder.step(*STEPS[0])])


@pytest.mark.slow
def test_swanlab_offline_run_read_back_with_swanlab(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    from paddle_amp_ext.dashboards.swanlab_run import SwanLabRun

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _through(SwanLabRun, tmp_path / "logs")
    data = read_swanlab(str(tmp_path / "logs"))
    assert data[LOSS] == [(0, 0.5), (1, math.inf), (2, 0.25)]
    assert data[SCALE] == [(0, 65536.0), (1, 32768.0), (2, 1e39)]  # float64 kept
    assert not os.path.exists(tmp_path / "home"), "SwanLab wrote outside the logdir"


@pytest.mark.slow
def test_wandbs_own_run_read_back_with_wandb(tmp_path, monkeypatch):
    """The library's run (what WANDB_MODE=online uses), here in W&B's offline mode: nothing is sent."""
    pytest.importorskip("wandb")
    from paddle_amp_ext.dashboards.wandb_run import WandbRun

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    _through(WandbRun, tmp_path / "logs")
    data = read_wandb(str(tmp_path / "logs"), wait=30)
    assert data[LOSS] == [(0, 0.5), (1, math.inf), (2, 0.25)]
    assert data[SCALE] == [(0, 65536.0), (1, 32768.0), (2, 1e39)]
