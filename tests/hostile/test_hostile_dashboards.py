"""The dashboards' public pieces against hostile input: report_to of every wrong shape, unknown
metrics, values beyond float32, negative and huge steps, corrupt step lines, finished runs."""

from __future__ import annotations

import math
import os
import struct
import threading

import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import backends, metrics
from paddle_amp_ext.dashboards import tensorboard as tb
from paddle_amp_ext.dashboards._wire import float32_bytes, varint
from paddle_amp_ext.dashboards.library import LibraryRun, StepValues


@pytest.mark.parametrize("value, expected", [
    ("visualdl", ("visualdl",)), ("TensorBoard", ("tensorboard",)), (" wandb ", ("wandb",)),
    ("visualdl,tensorboard", ("visualdl", "tensorboard")), (["swanlab", "visualdl"], ("swanlab", "visualdl")),
    (("wandb",), ("wandb",)),
])
def test_report_to_accepts_names_lists_and_comma_strings(value, expected):
    assert backends.parse_report_to(value) == expected


@pytest.mark.parametrize("value, match", [
    ("tensorbord", r"Unknown dashboard 'tensorbord' in report_to\. Did you mean 'tensorboard'\?"),
    ("mlflow", r"Unknown dashboard 'mlflow' in report_to\. Expected one of \['visualdl', 'tensorboard', 'swanlab', 'wandb'\]"),
    (["visualdl", "VisualDL"], r"report_to names 'visualdl' twice"),
    ("", r"report_to names no dashboard: ''"),
    ([], r"report_to names no dashboard: \[\]"),
    ("none", r"Unknown dashboard 'none'"),
    ("visualdl,,wandb", r"Unknown dashboard '' in report_to"),
])
def test_report_to_refuses_unknown_repeated_and_empty_names(value, match):
    with pytest.raises(ValueError, match=match):
        backends.parse_report_to(value)


@pytest.mark.parametrize("value", [1, 1.5, {"visualdl": True}, b"visualdl", object(), True])
def test_report_to_of_the_wrong_type_names_it(value):
    with pytest.raises(TypeError, match=r"report_to must be a dashboard name or a list of them.*of type "
                                        + type(value).__name__):
        backends.parse_report_to(value)


def test_report_to_list_holding_a_non_string_names_the_item():
    with pytest.raises(TypeError, match=r"report_to must hold dashboard names \(str\)\. Received: None \(of type NoneType\)"):
        backends.parse_report_to(["visualdl", None])


def test_report_to_none_only_where_allowed():
    assert backends.parse_report_to("none", allow_none=True) == ()
    assert backends.parse_report_to(None, allow_none=True) == ()
    assert backends.parse_report_to([], allow_none=True) == ()
    with pytest.raises(ValueError, match="report_to names no dashboard: None"):
        backends.parse_report_to(None)
    with pytest.raises(ValueError, match="Unknown dashboard 'none'"):  # "none" beside a name is a mistake
        backends.parse_report_to(["none", "visualdl"], allow_none=True)


def test_require_names_the_extra_of_a_missing_library(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(ImportError, match=r"report_to='wandb' needs wandb with WANDB_MODE='online' \(unset it for the "
                                          r"offline run, written without it\): pip install 'paddle-amp-ext\[wandb\]'"):
        backends.require("wandb")
    with pytest.raises(ImportError, match=r"VisualDL hooks need VisualDL: pip install 'paddle-amp-ext\[visualdl\]'"):
        backends.require("visualdl")
    backends.require("tensorboard")  # written without a library
    for mode in ("offline", "dryrun", ""):
        monkeypatch.setenv("WANDB_MODE", mode)
        backends.require("wandb")  # W&B's offline run file too


@pytest.mark.parametrize("name", ["visual_dl", "", "VISUALDL"])
def test_backend_lookup_of_an_unparsed_name_names_the_known_ones(name):
    with pytest.raises(ValueError, match=r"Unknown dashboard .* Expected one of \['visualdl', 'tensorboard'"):
        backends.backend(name)
    with pytest.raises(ValueError, match="Unknown dashboard"):
        backends.require(name)
    with pytest.raises(ValueError, match="Unknown dashboard"):
        backends.view_command(name, "runs", "runs/exp")


def test_view_command_per_backend(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = os.path.join("my runs", "exp")  # a space: shown as given
    assert [backends.view_command(name, "my runs", run) for name in backends.NAMES] == [
        "python -m paddle_amp_ext.visualdl_serve --logdir my runs",
        "tensorboard --logdir my runs --host 127.0.0.1",
        f"swanlab sync {os.path.join(run, 'run-*')} (uploads it: SwanLab has no offline viewer)",
        f"wandb leet {os.path.join(run, 'wandb')} (W&B's terminal viewer; upload: wandb sync "
        f"{os.path.join(run, 'wandb', 'offline-run-*')})",
    ]
    monkeypatch.setenv("WANDB_MODE", "online")  # W&B's own run: it uploads, there is no offline run to sync
    assert backends.view_command("wandb", "runs", "runs/exp") == (
        f"wandb leet {os.path.join('runs/exp', 'wandb')} (W&B's terminal viewer; W&B uploads it in WANDB_MODE=online)")


@pytest.mark.parametrize("name", ["amp/los", "loss_scale", "", None, 3, ["amp/loss"]])
def test_unknown_metric_names_the_registered_ones(name):
    with pytest.raises(KeyError, match=r"is not an AMP metric\. Expected one of \['amp/loss', "):
        metrics.metric(name)


def test_metric_is_frozen():
    with pytest.raises(AttributeError):
        metrics.LOSS.name = "amp/other"


@pytest.mark.parametrize("value, stored", [(1e39, math.inf), (-1e300, -math.inf), (math.nan, None),
                                           (3.4028235e38, 3.4028234663852886e38), (-0.0, -0.0), (1e-50, 0.0)])
def test_float32_bytes_saturates_like_numpy(value, stored):
    (back,) = struct.unpack("<f", float32_bytes(value))
    if stored is None:
        assert math.isnan(back)
    else:
        assert back == stored and math.copysign(1, back) == math.copysign(1, stored)


def test_varint_of_large_values():
    assert varint(0) == b"\x00" and varint(127) == b"\x7f" and varint(128) == b"\x80\x01"
    assert varint(2**64 - 1) == b"\xff" * 9 + b"\x01"


def test_event_encoder_with_no_values_huge_and_negative_steps_and_unicode_tags():
    from tensorboard.compat.proto import event_pb2

    encoder = tb.EventEncoder()
    for step, values in [(0, []), (2**62, [("amp/λ", 1.0)]), (-1, [(metrics.LOSS.name, math.nan)])]:
        record = encoder.step(step, 0, values)
        length = struct.unpack("<Q", record[:8])[0]
        event = event_pb2.Event.FromString(record[12:12 + length])
        assert event.step == step and [v.tag for v in event.summary.value] == [t for t, _ in values]
        assert record[12 + length:] == tb._masked(record[12:12 + length])


class _Recording(LibraryRun):
    library = "Recorder"

    def _open(self):
        self.logged, self.finished = [], 0
        return object()

    def _log(self, step, values):
        self.logged.append((step, values))

    def _finish(self):
        self.finished += 1
        raise RuntimeError("the library failed at finish")


def test_library_run_skips_negative_steps_keeps_nan_and_survives_a_failing_finish(tmp_path, caplog):
    run = _Recording(str(tmp_path), "r")
    encoder = StepValues()
    loss = metrics.LOSS.name
    run.write([encoder.step(-1, 0, [(loss, 1.0)]), encoder.step(3, 0, [(loss, math.nan)])])
    assert len(run.logged) == 1 and run.logged[0][0] == 3 and math.isnan(run.logged[0][1][loss])
    assert not run.removed()
    run.close()
    run.close()
    assert run.finished == 1 and "Recorder could not finish its run" in caplog.text
    with pytest.raises(OSError, match="the Recorder run in .* is finished"):
        run.write([encoder.step(4, 0, [])])


@pytest.mark.parametrize("value", ["1.0", None, [1.0], object()])
def test_a_library_step_refuses_a_value_that_is_not_a_number(value):
    with pytest.raises(TypeError, match=r"A recorded value must be a real number\. Received: .* for 'amp/loss'"):
        StepValues().step(0, 0, [(metrics.LOSS.name, 1.0), (metrics.LOSS.name, value)])
    logged = StepValues().step(2, 0, [(metrics.LOSS.name, True), (metrics.LR.name, 3)])  # bool and int are real
    assert (logged.step, logged.values) == (2, {metrics.LOSS.name: True, metrics.LR.name: 3})


@pytest.mark.parametrize("value", ["1.0", None, [1.0], object()])
def test_float32_bytes_names_a_value_that_is_not_a_number(value):
    with pytest.raises(TypeError, match=r"A recorded value must be a real number\. Received: "):
        float32_bytes(value)


def test_varint_of_negative_and_oversized_ints_is_64_bit():
    assert varint(-1) == b"\xff" * 9 + b"\x01"
    assert varint(2**64 + 5) == varint(5)


# ---------------------------------------------------------------- report_to on the hook and callbacks


@pytest.mark.parametrize("report_to, error", [("tensorbord", ValueError), (["visualdl", 3], TypeError),
                                              ({"visualdl"}, TypeError), ("", ValueError), ("none", ValueError)])
def test_a_bad_report_to_is_refused_before_anything_is_created(tmp_path, report_to, error):
    with pytest.raises(error, match="report_to"):
        amp.VisualDLHook(str(tmp_path / "runs"), report_to=report_to)
    with pytest.raises(error, match="report_to"):
        amp.VisualDLCallback(str(tmp_path / "runs"), report_to=report_to)
    assert not (tmp_path / "runs").exists()


def test_a_missing_library_is_named_before_any_directory_is_made(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    monkeypatch.setenv("SWANLAB_MODE", "online")  # SwanLab's own run: its library is needed
    with pytest.raises(ImportError, match=r"report_to='swanlab' needs swanlab with SWANLAB_MODE='online' \(unset it "
                                          r"for the offline run, written without it\): pip install "
                                          r"'paddle-amp-ext\[swanlab\]'"):
        amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "swanlab"])
    assert not (tmp_path / "runs").exists()
    monkeypatch.delenv("SWANLAB_MODE")  # offline: the run file is written without SwanLab
    amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "swanlab"], run_name="r").close()
    assert list((tmp_path / "runs" / "r").glob("run-*/run-*.swanlab"))


def test_a_backend_failing_to_open_closes_the_ones_opened_before(tmp_path, monkeypatch):
    from paddle_amp_ext.visualdl import shutdown, writer

    real = writer.open_target

    def failing(name, *args):
        if name == "tensorboard":
            raise RuntimeError("the library refused to start")
        return real(name, *args)

    monkeypatch.setattr(writer, "open_target", failing)
    before = set(shutdown._open)
    with pytest.raises(RuntimeError, match="the library refused to start"):
        amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "tensorboard"], run_name="r")
    assert set(shutdown._open) == before, "the VisualDL writer opened first is closed, not left registered"
    assert [p.name for p in (tmp_path / "runs" / "r").iterdir()][0].startswith("vdlrecords.")


def test_two_backends_read_each_device_value_once(tmp_path, monkeypatch):
    import paddle

    from paddle_amp_ext.events import StepEvent, StepResult

    reads = []
    real = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy", lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    hook = amp.VisualDLHook(str(tmp_path), report_to=["visualdl", "tensorboard"], flush_every=4,
                            flush_secs=float("inf"), run_name="r")
    for step in range(8):
        hook.on_step(StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 8.0), 0.1, 8.0))
    hook.close()
    assert len(reads) == 2, "one stacked read per flush of 4 steps, shared by both backends"
    from dashboard_readers import read_tensorboard, read_visualdl

    assert read_tensorboard(hook.logdir) == read_visualdl(hook.logdir)
    assert [v for _, v in read_visualdl(hook.logdir)[metrics.LOSS.name]] == [float(s) for s in range(8)]


def test_a_forked_child_never_finishes_the_parents_library_run(tmp_path):
    marker = tmp_path / "finished-in"

    class Marking(_Recording):
        def _finish(self):
            marker.write_text(str(os.getpid()))

    run = Marking(str(tmp_path), "r")
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker that exits through the same objects
        run.close()
        os._exit(0)
    os.waitpid(pid, 0)
    assert not marker.exists(), "the child finished the parent's run"
    run.close()
    assert marker.read_text() == str(os.getpid())


def test_varint_equals_protobufs_own_encoder_across_its_cache():
    """Every width, the boundaries, ints past 64 bits and negative ones, and more distinct high
    parts than the cache keeps (it is emptied and refilled): protobuf's own ``_VarintBytes`` of
    the low 64 bits, every time."""
    import random

    from google.protobuf.internal.encoder import _VarintBytes

    from paddle_amp_ext.dashboards import _wire

    rng = random.Random(7)
    values = [2**k + d for k in range(0, 65) for d in (-1, 0, 1)] + [rng.getrandbits(rng.randint(1, 64))
                                                                      for _ in range(20000)]
    values += list(range(16000, 16400)) + [1_700_000_000_000 + ms for ms in range(0, 700_000, 97)]
    for value in values + values:  # the second pass from the cache
        assert varint(value) == _VarintBytes(value & (2**64 - 1)), value
    assert len(_wire._HIGH) <= 4096
    for value in (-1, -(2**63), 2**64, 2**64 + 2**30, 2**80 + 16384):
        assert varint(value) == _VarintBytes(value & (2**64 - 1)), value


def test_varint_from_many_threads_at_once():
    from google.protobuf.internal.encoder import _VarintBytes

    failures = []

    def encode(start):
        for value in range(start, start + 30000, 3):
            if varint(value) != _VarintBytes(value):
                failures.append(value)

    threads = [threading.Thread(target=encode, args=(base,)) for base in (16384, 1 << 21, 1 << 35, 1 << 62)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
