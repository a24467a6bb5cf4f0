"""SwanLab's offline run file, written without SwanLab: the same records, byte for byte, as
SwanLab's protobuf classes serialize and as SwanLab's own offline run holds for the same steps,
read back with SwanLab's own reader (the one ``swanlab sync`` uses)."""

from __future__ import annotations

import glob
import math
import os

import numpy as np
import pytest
from dashboard_readers import leveldb_payloads, read_swanlab, read_visualdl, swanlab_records

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import backends, metrics
from paddle_amp_ext.dashboards import swanlab_file as sf
from paddle_amp_ext.visualdl.targets import SwanLabFile, open_target

pytest.importorskip("swanlab")
LOSS, SCALE = metrics.LOSS.name, metrics.LOSS_SCALE.name
STEPS = [(0, [(SCALE, 65536.0), ("amp/found_inf", 0.0), (LOSS, 0.5)]),
         (1, [(SCALE, 32768.0), ("amp/found_inf", 1.0), (LOSS, math.inf)]),
         (2, [(SCALE, 1e39), ("amp/found_inf", -0.0), (LOSS, math.nan), ("fp8/a b/注意/amax", 3.0)]),
         (300, [(SCALE, 7.0), ("amp/found_inf", 2.5), (LOSS, -math.inf), ("fp8/a b/注意/amax", 1e-300)])]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _payloads(data: bytes) -> list:
    return list(leveldb_payloads(b":W&B" + data[4:]))  # the same LevelDB log under SwanLab's magic


def test_records_are_byte_identical_to_swanlabs_protobuf_classes():
    from google.protobuf.timestamp_pb2 import Timestamp
    from swanlab.proto.swanlab.metric.column.v1.column_pb2 import ColumnRecord
    from swanlab.proto.swanlab.metric.data.v1.data_pb2 import ScalarRecord, ScalarValue
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.proto.swanlab.run.v1.run_pb2 import FinishRecord, StartRecord
    from swanlab.proto.swanlab.save.v1.save_pb2 import SaveRecord

    def ts(ms):
        return Timestamp(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)

    info = sf.RunInfo("exp", run_id="abcd1234", start_ms=1_700_000_000_123, color="#e282c6")
    encoder, sequence = sf.ScalarEncoder(), sf.Sequence()
    data = sf.header(info, "/r/files", 1_700_000_000_200)
    body, state = sequence.encode([encoder.step(s, 1_700_000_001_000 + s, v) for s, v in STEPS], len(data), 5000)
    sequence.commit(state)
    data += body
    data += sequence.end_records(len(data), "/r/files", 9000)
    expected = [Record(num=-1, timestamp=ts(1_700_000_000_200), start=StartRecord(
                    project="paddle-amp-ext", name="exp", color="#e282c6", id="abcd1234",
                    started_at=ts(1_700_000_000_123))),
                Record(num=-4, timestamp=ts(1_700_000_000_200), save=SaveRecord(
                    name="metadata", source_path="/r/files/swanlab-metadata.json", type=2))]
    num, seen = 0, set()
    for step, values in STEPS:
        for key, value in values:
            if key not in seen:
                seen.add(key)
                num += 1
                section = key.split("/")[0] if "/" in key else ""
                expected.append(Record(num=num, timestamp=ts(5000), column=ColumnRecord(
                    column_class=1, column_type=1, column_key=key, section_name=section, section_type=3)))
            num += 1
            expected.append(Record(num=num, timestamp=ts(5000), scalar=ScalarRecord(
                key=key, step=step, type=1, timestamp=ts(1_700_000_001_000 + step), value=ScalarValue(number=value))))
    expected += [Record(num=-3, timestamp=ts(9000), save=SaveRecord(name="config", source_path="/r/files/config.yaml",
                                                                    type=1)),
                 Record(num=-2, timestamp=ts(9000), finish=FinishRecord(state=1, finished_at=ts(9000)))]
    assert data[:7] == b":SWL\xd6\xe1\x02"
    assert _payloads(data) == [r.SerializeToString() for r in expected]


@pytest.mark.slow
def test_our_file_and_swanlabs_own_run_hold_the_same_records(tmp_path):
    """The same steps through ``swanlab.init(mode="offline")`` and through our file: the same
    records (all but times, the run's id and color, and the run directory in the save records),
    the same side files."""
    import swanlab

    settings = swanlab.Settings(interactive=False, terminal={"proxy_type": "none"},
                                probe={"hardware": False, "runtime": False, "requirements": False, "conda": False,
                                       "git": False, "swanlab": False, "monitor": False})
    run = swanlab.init(project="paddle-amp-ext", name="exp", log_dir=str(tmp_path / "theirs"), mode="offline",
                       reinit=True, settings=settings)
    for step, values in STEPS:
        run.log(dict(values), step=step)
    run.finish()
    (tmp_path / "ours").mkdir()
    target, encoder = open_target("swanlab", str(tmp_path), ["ours", "exp"], "")
    assert isinstance(target, SwanLabFile)
    target.write([encoder.step(s, 1_700_000_000_000 + s, v) for s, v in STEPS[:2]])
    target.write([encoder.step(s, 1_700_000_000_000 + s, v) for s, v in STEPS[2:]])
    target.close()

    def normalized(side):
        (path,) = glob.glob(str(tmp_path / side / "**" / "run-*.swanlab"), recursive=True)
        run_dir = os.path.dirname(path)
        out = []
        for record in swanlab_records(str(tmp_path / side)):
            record.ClearField("timestamp")
            kind = record.WhichOneof("record_type")
            if kind == "start":
                for name in ("id", "color", "started_at"):
                    record.start.ClearField(name)
            elif kind == "scalar":
                record.scalar.ClearField("timestamp")
            elif kind == "finish":
                record.finish.ClearField("finished_at")
            elif kind == "save":
                record.save.source_path = record.save.source_path.replace(run_dir, "RUN")
            out.append(record.SerializeToString())
        files = {name: (tmp_path / side / run_dir / "files" / name).read_bytes()
                 for name in os.listdir(os.path.join(run_dir, "files"))}
        return out, files, os.path.basename(path).startswith("run-") and os.path.basename(run_dir).startswith("run-")

    assert normalized("ours") == normalized("theirs")
    assert read_swanlab(str(tmp_path / "ours"))[LOSS][:2] == [(0, 0.5), (1, math.inf)]


@pytest.mark.slow
def test_a_hooks_swanlab_records_equal_its_visualdl_records(tmp_path):
    from test_visualdl import train

    with amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "swanlab"], run_name="exp") as hook:
        train(hook, steps=4)
    swan, vdl = read_swanlab(hook.logdir), read_visualdl(hook.logdir)
    assert set(swan) == set(vdl) and swan
    for tag in vdl:
        assert [(s, float(np.float32(v))) for s, v in swan[tag]] == vdl[tag], tag
    kinds = [r.WhichOneof("record_type") for r in swanlab_records(hook.logdir)]
    assert kinds[:2] == ["start", "save"] and kinds[-2:] == ["save", "finish"]
    assert not os.path.exists(tmp_path / "home" / ".swanlab"), "SwanLab's folder written outside the logdir"


def test_swanlab_sync_takes_the_file_as_its_run(tmp_path):
    """What ``swanlab sync`` asks of a run directory before it uploads: one ``run-*.swanlab``
    whose first record is the start record (``CoreContext.run_file`` in sync mode,
    ``CoreSyncPython.deliver_sync_start``)."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    target, encoder = open_target("swanlab", str(tmp_path), ["exp"], "")
    target.write([encoder.step(0, 1000, [(LOSS, 1.0)])])
    target.close()
    (run_dir,) = glob.glob(str(tmp_path / "exp" / "run-*"))
    (run_file,) = sorted(glob.glob(os.path.join(run_dir, "run-*.swanlab")))
    reader = DataStoreReader()
    reader.open(run_file)
    assert Record.FromString(reader.scan()).start.name == "exp"
    reader.close()
    assert backends.view_command("swanlab", "runs", "runs/exp") == (
        "swanlab sync runs/exp/run-* (uploads it: SwanLab has no offline viewer)")


def test_swanlab_mode_online_keeps_swanlabs_own_run(tmp_path, monkeypatch):
    """SWANLAB_MODE=online (checked without a network: the library's run is opened, not started)."""
    from paddle_amp_ext.dashboards.library import StepValues
    from paddle_amp_ext.dashboards.swanlab_run import SwanLabRun

    opened = []
    monkeypatch.setattr(SwanLabRun, "_open", lambda self: opened.append(os.environ["SWANLAB_MODE"]) or object())
    for mode, own_file in [("online", False), ("ONLINE ", False), ("local", False), ("disabled", False),
                           ("offline", True), ("", True)]:
        monkeypatch.setenv("SWANLAB_MODE", mode)
        target, encoder = open_target("swanlab", str(tmp_path), [f"r{len(opened)}-{own_file}-{mode.strip()}"], "")
        assert isinstance(target, SwanLabFile) is own_file, mode
        assert isinstance(encoder, StepValues) is not own_file
        target.close() if own_file else None
    assert opened == ["online", "ONLINE ", "local", "disabled"]
    monkeypatch.setenv("SWANLAB_MODE", "online")
    assert "SWANLAB_MODE=online" in backends.view_command("swanlab", "runs", "runs/exp")


@pytest.mark.slow
def test_swanlab_mode_disabled_runs_swanlabs_library_through_the_hook(tmp_path, monkeypatch):
    """SwanLab's own run, for real, in the one mode that needs no network."""
    monkeypatch.setenv("SWANLAB_MODE", "disabled")
    from test_visualdl import train

    with amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "swanlab"], run_name="exp") as hook:
        train(hook, steps=2)
    assert not glob.glob(str(tmp_path / "runs" / "**" / "run-*.swanlab"), recursive=True)
    assert read_visualdl(hook.logdir)[LOSS]


class _StandIn:
    """A stand-in SwanLab server on 127.0.0.1: the answers ``swanlab sync`` 0.10.3 needs (login,
    project, experiment), every request kept."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size) if size else b""
                path = self.path.split("?")[0]
                outer.requests.append((self.command, path, json.loads(body) if body else None))
                run = {"cuid": "e1", "slug": "e1", "name": "exp", "state": "RUNNING",
                       "createdAt": "2026-01-01T00:00:00.000Z"}
                if path == "/api/login/api_key":
                    out = {"sid": "s", "expiredAt": "2099-01-01T00:00:00.000Z", "userInfo": {"username": "u"}}
                elif path.endswith("/experiment") or "/runs/" in path and self.command == "GET":
                    out = run
                elif path.startswith("/api/project/") and self.command == "GET":
                    out = {"cuid": "p1", "name": "paddle-amp-ext", "path": "u/paddle-amp-ext",
                           "group": {"username": "u"}, "_count": {"experiments": 0}}
                else:
                    out = {}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metrics(self) -> dict:
        out: dict = {}
        for _method, path, body in self.requests:
            if path == "/api/house/metrics":
                for item in body["metrics"]:
                    out.setdefault(item["key"], []).append((item["index"], item["data"]))
        return out


@pytest.mark.slow
def test_swanlab_sync_uploads_a_hooks_run_to_a_loopback_server(tmp_path):
    """``swanlab sync`` (swanlab 0.10.3's own CLI) reads a hook's run file and uploads every step,
    the columns, the metadata and config, and the finished state to a stand-in server on 127.0.0.1."""
    import subprocess
    import sys

    from test_visualdl import train

    with amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "swanlab"], run_name="exp") as hook:
        train(hook, steps=5)
    (run_dir,) = glob.glob(os.path.join(hook.logdir, "run-*"))
    server = _StandIn()
    try:
        env = dict(os.environ, HOME=str(tmp_path / "home"))
        env.pop("SWANLAB_MODE", None)
        proc = subprocess.run([sys.executable, "-m", "swanlab", "sync", "-k", "k" * 21, "-h", server.url, run_dir],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    finally:
        server.server.shutdown()
    vdl = read_visualdl(hook.logdir)
    uploaded = server.metrics()
    assert set(uploaded) == set(vdl) and len(vdl[LOSS]) == 5
    for tag, series in vdl.items():  # SwanLab's sync sends a non-finite value as "nan"
        assert [(s, float(np.float32(v)) if isinstance(v, float) else v) for s, v in uploaded[tag]] == [
            (s, v if math.isfinite(v) else "nan") for s, v in series], tag
    (columns,) = [body for method, path, body in server.requests if path == "/api/experiment/e1/columns"]
    assert {c["key"] for c in columns} == set(vdl)
    assert ("PUT", "/api/project/u/paddle-amp-ext/runs/e1/state") in [(m, p) for m, p, _ in server.requests]
    (state,) = [body for m, p, body in server.requests if p.endswith("/state")]
    assert state["state"] == "FINISHED"
