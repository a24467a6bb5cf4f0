"""report_to="wandb": W&B's offline run file written by this package, checked against W&B itself:
its protobuf classes (byte-identical records), wandb-core's own writer (byte-identical framing),
a real ``wandb.init(mode="offline")`` run of the same steps (the same records), wandb-core's own
reader (``wandb leet inspect``), and ``wandb sync`` uploading it to a stand-in server on 127.0.0.1."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from dashboard_readers import (
    _leveldb_records,
    history_items,
    leveldb_payloads,
    read_wandb,
    wandb_inspect,
    wandb_records,
)

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import metrics
from paddle_amp_ext.dashboards import wandb_file as wf
from paddle_amp_ext.visualdl.targets import WandbFile, open_target

pytest.importorskip("wandb")
pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

LOSS, SCALE, LR = metrics.LOSS.name, metrics.LOSS_SCALE.name, metrics.LR.name
STEPS = [(0, 1_700_000_000_000, [(LOSS, 0.5), (SCALE, 65536.0), (LR, 1e-4)]),
         (1, 1_700_000_000_250, [(LOSS, math.inf), (SCALE, 32768.0), (LR, 1e-4)]),
         (2, 1_700_000_000_500, [(LOSS, 0.25), (SCALE, 1e39), (LR, 0.0)]),
         (7, 1_700_000_001_000, [(LOSS, math.nan), (SCALE, -math.inf), (LR, 3)])]
INFO = wf.RunInfo("exp", run_id="abc12345", start_ms=1_699_999_999_875, host="node-1")


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _records(data: bytes) -> list:
    return list(leveldb_payloads(data))


def _items(pairs) -> list:
    return [pb.HistoryItem(nested_key=[key], value_json=value) for key, value in pairs]


def test_records_are_byte_identical_to_wandbs_protobuf_classes():
    header, run = _records(wf.header(INFO))
    info = pb.Record.DESCRIPTOR.fields_by_name["_info"].message_type._concrete_class(stream_id="abc12345")
    version = pb.VersionInfo(producer="paddle-amp-ext", min_consumer=wf.MIN_CONSUMER)
    assert header == pb.Record(num=1, header=pb.HeaderRecord(version_info=version), _info=info).SerializeToString()
    config = pb.ConfigRecord(update=[pb.ConfigItem(key="_wandb", value_json="{}")])
    run_record = pb.RunRecord(run_id="abc12345", project="paddle-amp-ext", config=config, display_name="exp",
                              host="node-1")
    run_record.start_time.FromMilliseconds(1_699_999_999_875)
    assert run == pb.Record(num=2, run=run_record, _info=info).SerializeToString()

    encoder, sequence = wf.HistoryEncoder(INFO), wf.Sequence(INFO)
    data, state = sequence.encode([encoder.step(*s) for s in STEPS], len(wf.MAGIC))
    sequence.commit(state)
    *history, summary = _records(wf.MAGIC + data)
    expected = []
    for num, (step, wall, values) in enumerate(STEPS, start=3):
        pairs = [(tag, json.dumps(float(v))) for tag, v in values] + [
            ("_timestamp", json.dumps(wall / 1000)), ("_runtime", json.dumps((wall - INFO.start_ms) / 1000)),
            ("_step", str(step))]
        expected.append(pb.Record(num=num, history=pb.HistoryRecord(item=_items(pairs), step=pb.HistoryStep(num=step))))
    assert history == [r.SerializeToString() for r in expected]
    assert summary == pb.Record(num=7, summary=pb.SummaryRecord(update=[
        pb.SummaryItem(nested_key=list(i.nested_key), value_json=i.value_json) for i in expected[-1].history.item]
    )).SerializeToString()
    runtime, exit_record = _records(wf.MAGIC + sequence.exit_records(len(wf.MAGIC), now_ms=1_700_000_010_000))
    assert runtime == pb.Record(num=8, summary=pb.SummaryRecord(update=[
        pb.SummaryItem(nested_key=["_wandb", "runtime"], value_json="10")])).SerializeToString()
    assert exit_record == pb.Record(num=9, exit=pb.RunExitRecord(exit_code=0, runtime=10),
                                    _info=info).SerializeToString()
    assert [json.loads(i.value_json) for i in expected[1].history.item][0] == math.inf  # "Infinity", as W&B's


REAL_RUN = textwrap.dedent('''
    import json, math, sys
    import wandb
    settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                              x_disable_machine_info=True, x_save_requirements=False, save_code=False,
                              disable_git=True, disable_job_creation=True)
    run = wandb.init(mode="offline", dir=sys.argv[1], project="paddle-amp-ext", name="exp", settings=settings)
    for step, _, values in json.load(open(sys.argv[2])):
        run.log({tag: float(value) for tag, value in values}, step=step, commit=True)
    run.finish()
''')


def real_wandb_run(tmp_path, steps) -> str:
    """The .wandb file of a real ``wandb.init(mode="offline")`` run logging ``steps``, complete."""
    script = tmp_path / "real.py"
    script.write_text(REAL_RUN)
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "real"), str(tmp_path / "steps.json")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wandb_records(str(tmp_path / "real"), wait=30)  # its service process writes the end after finish()
    (path,) = (tmp_path / "real").rglob("run-*.wandb")
    return str(path)


def ours(logdir, steps, name="ours") -> str:
    os.makedirs(logdir, exist_ok=True)
    target, encoder = open_target("wandb", str(logdir), [name], "")
    assert isinstance(target, WandbFile)
    target.write([encoder.step(*s) for s in steps])
    target.close()
    return target.path


@pytest.mark.slow
def test_framing_is_byte_identical_to_wandb_cores_writer(tmp_path):
    """A real run whose records cross 32 KiB blocks (and one record longer than two blocks): its
    records framed again by :func:`frame` give wandb-core's file byte for byte."""
    steps = [(s, 0, [(f"{LOSS}/{k}", s + k / 7) for k in range(12)]) for s in range(300)]
    steps.insert(150, (150, 0, [("a_long_series_name/" + "x" * 70_000, 1.0)]))
    steps = [(s, w, v) for i, (s, w, v) in enumerate(steps) if i != 151]  # step 150 once: the long one
    path = real_wandb_run(tmp_path, steps)
    data = open(path, "rb").read()
    assert len(data) > 4 * wf.BLOCK
    out = wf.MAGIC
    for record in _leveldb_records(path):
        out += wf.frame(record, len(out))
    assert out == data


def _norm(items: dict) -> dict:
    """{key: value} with numbers as repr(float) (NaN equal to NaN, 3 to 3.0), the times left out."""
    return {k: repr(float(v)) for k, v in items.items() if k not in ("_runtime", "_timestamp")}


def _comparable(records) -> list:
    """(type, items without the times) per record, W&B's per-step telemetry and summaries left out."""
    out = []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind in ("telemetry", "summary"):
            continue
        items = None
        if kind == "history":
            items = _norm(history_items(record))
            items["step.num"] = record.history.step.num
        out.append((kind, items))
    return out


@pytest.mark.slow
def test_our_file_and_wandbs_own_run_hold_the_same_records(tmp_path):
    real = real_wandb_run(tmp_path, STEPS)
    mine = ours(tmp_path / "ours", STEPS, name="exp")
    real_records, our_records = wandb_records(str(tmp_path / "real")), wandb_records(str(tmp_path / "ours"))
    assert _comparable(our_records) == _comparable(real_records)
    assert [r.WhichOneof("record_type") for r in our_records] == ["header", "run"] + ["history"] * 4 + [
        "summary", "summary", "exit"]
    (a,), (b,) = [[r.run for r in records if r.WhichOneof("record_type") == "run"]
                  for records in (real_records, our_records)]
    assert (a.project, a.display_name, a.host, len(a.run_id)) == (b.project, b.display_name, b.host, len(b.run_id))
    assert a.config == b.config and b.start_time.seconds > 0
    summaries = []
    for records in (real_records, our_records):  # the run's summary: its updates applied in order (bar the time)
        summary: dict = {}
        for r in records:
            if r.WhichOneof("record_type") == "summary":
                summary.update(history_items(r))
        summaries.append(_norm(summary))
    assert summaries[0].pop("_wandb/runtime") == summaries[1].pop("_wandb/runtime") == "0.0"
    assert summaries[0] == summaries[1] and summaries[1][SCALE] == "-inf"
    # W&B's own reader (wandb-core's, what `wandb sync` reads with) gives the same history for both
    histories = [[_norm({k: v for k, v in r["history"]["item"].items()}) for r in wandb_inspect(p)
                  if r["type"] == "history"] for p in (real, mine)]
    assert histories[0] == histories[1] and len(histories[0]) == 4


@pytest.mark.slow
def test_wandbs_own_reader_and_sync_take_a_hooks_run_offline(tmp_path):
    """Through the hook: wandb-core's reader reads the file end to end (``leet inspect --summary``:
    finished, the last step, the summary) and ``wandb sync --dry-run`` finds the run, with no network."""
    with amp.VisualDLHook(str(tmp_path / "runs"), report_to="wandb", run_name="exp", flush_every=4) as hook:
        from test_visualdl import train

        reported = train(hook, steps=10)
    (path,) = (tmp_path / "runs" / "exp" / "wandb").glob("offline-run-*/run-*.wandb")
    assert sorted(os.listdir(path.parent)) == ["files", path.name]
    outside = [str(p.relative_to(tmp_path / "home")) for p in (tmp_path / "home").rglob("*") if p.is_file()]
    assert [p for p in outside if not p.startswith((".cache/paddle_amp_ext/", ".visualdl/"))] == []  # the
    # rehearsal's kernel cache and test_visualdl's import of VisualDL (for train())
    assert not (tmp_path / "wandb-cache").exists(), "no W&B service process ran"
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert (summary["state"], summary["step"], summary["name"], summary["exit_code"]) == ("finished", 9, "exp", 0)
    assert summary["summary"][SCALE] == reported[-1][2]
    proc = subprocess.run([sys.executable, "-m", "wandb", "sync", "--dry-run", str(path.parent)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "Would sync 1 run(s)" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    data = read_wandb(str(tmp_path / "runs"))
    assert [v for _, v in data[SCALE]] == [r[2] for r in reported]


def test_wandb_mode_online_keeps_wandbs_own_run(tmp_path, monkeypatch):
    """WANDB_MODE=online (checked without a network: the library's run is opened, not started)."""
    from paddle_amp_ext.dashboards.library import StepValues
    from paddle_amp_ext.dashboards.wandb_run import WandbRun

    opened = []
    monkeypatch.setattr(WandbRun, "_open", lambda self: opened.append(os.environ["WANDB_MODE"]) or object())
    for mode, own_file in [("online", False), ("ONLINE ", False), ("shared", False), ("disabled", False),
                           ("offline", True), ("dryrun", True), ("", True)]:
        monkeypatch.setenv("WANDB_MODE", mode)
        target, encoder = open_target("wandb", str(tmp_path), [f"r{len(opened)}-{own_file}-{mode.strip()}"], "")
        assert isinstance(target, WandbFile) is own_file, mode
        assert isinstance(encoder, StepValues) is not own_file
        target.close() if own_file else None
    assert opened == ["online", "ONLINE ", "shared", "disabled"]


@pytest.mark.slow
def test_wandb_mode_disabled_runs_wandbs_library_through_the_hook(tmp_path, monkeypatch):
    """W&B's own run, for real, in the one mode that needs no network: the steps go to its log()."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from test_visualdl import train

    with amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "wandb"], run_name="exp") as hook:
        train(hook, steps=3)
    assert hook.dropped_steps == 0
    assert not list((tmp_path / "runs").rglob("*.wandb"))


class _FakeWandbServer:
    """Just enough of W&B's server on 127.0.0.1 for ``wandb sync``: GraphQL ``UpsertBucket`` and
    ``CreateRunFiles``, the run's file stream and file uploads; it keeps what was sent."""

    def __init__(self):
        import http.server
        import re
        import threading

        self.history, self.stream, self.uploads, self.queries = [], [], {}, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/graphql":
                    query = json.loads(body)
                    name = re.search(r"(?:mutation|query)\s+(\w+)", query["query"]).group(1)
                    variables = query.get("variables") or {}
                    server.queries.append(name)
                    if name == "UpsertBucket":
                        project = {"id": "UA", "name": variables.get("project"), "entity": {"id": "RQ", "name": "tester"}}
                        return self._reply({"data": {"upsertBucket": {"inserted": True, "bucket": {
                            "id": "QQ", "name": variables.get("name"), "displayName": variables.get("displayName"),
                            "description": "", "config": "{}", "historyLineCount": 0, "project": project}}}})
                    if name == "CreateRunFiles":
                        port = self.server.server_address[1]
                        return self._reply({"data": {"createRunFiles": {"runID": "QQ", "uploadHeaders": [], "files": [
                            {"name": f, "uploadUrl": f"http://127.0.0.1:{port}/upload/{f}"} for f in variables["files"]]}}})
                    return self._reply({"data": {}})
                if self.path.endswith("/file_stream"):
                    update = json.loads(body)
                    server.stream.append(update)
                    history = update.get("files", {}).get("wandb-history.jsonl", {})
                    server.history += [json.loads(line) for line in history.get("content", [])]
                return self._reply({"exitcode": None, "limits": {}})  # the file stream; wandb-core's telemetry

            def do_PUT(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.uploads[self.path.rsplit("/", 1)[-1]] = body
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow
def test_wandb_sync_uploads_a_hooks_run_to_a_loopback_server(tmp_path):
    """W&B's own ``wandb sync`` replays the file to a W&B server (a fake one on 127.0.0.1): the run
    is created with its name, every step's history line and the summary are uploaded, the run ends
    with exit code 0."""
    from dashboard_readers import read_visualdl
    from test_visualdl import train

    with amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", "wandb"], run_name="exp",
                          flush_every=4) as hook:
        train(hook, steps=10)
    (run_dir,) = (tmp_path / "runs" / "exp" / "wandb").glob("offline-run-*")
    server = _FakeWandbServer()
    try:
        env = dict(os.environ, WANDB_BASE_URL=server.url, WANDB_API_KEY="a" * 40)
        env.pop("WANDB_MODE"), env.pop("WANDB_SILENT")  # sync prints its progress
        proc = subprocess.run([sys.executable, "-m", "wandb", "sync", str(run_dir)], capture_output=True, text=True,
                              timeout=180, env=env, cwd=tmp_path)  # it writes wandb/logs/debug-sync.* in its cwd
    finally:
        server.close()
    assert proc.returncode == 0 and "Finished syncing" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert server.queries[0] == "UpsertBucket" and "CreateRunFiles" in server.queries
    visualdl = read_visualdl(hook.logdir)
    assert [line["_step"] for line in server.history] == list(range(10))
    by_step = {line["_step"]: line for line in server.history}
    for name, series in visualdl.items():  # a step without a value (the grad norm of a skipped step) has none
        assert str([(s, float(np.float32(by_step[s][name]))) for s, _ in series]) == str(series), name
        assert sum(name in line for line in server.history) == len(series), name
    summary = json.loads(server.uploads["wandb-summary.json"])
    assert summary["_step"] == 9 and summary[SCALE] == visualdl[SCALE][-1][1]
    assert [u.get("exitcode") for u in server.stream if u.get("complete")] == [0]
    assert (run_dir / f"{next(run_dir.glob('run-*.wandb')).name}.synced").exists()


ONLINE_SCRIPT = textwrap.dedent('''
    import sys
    import paddle
    import paddle_amp_ext as amp
    from paddle_amp_ext.events import StepEvent, StepResult
    hook = amp.VisualDLHook(sys.argv[1], report_to=["visualdl", "wandb"], run_name="exp", flush_every=3)
    for step in range(7):
        hook.on_step(StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 8.0), 0.1, 8.0))
    hook.close()
''')


@pytest.mark.slow
def test_wandb_mode_online_uploads_live_through_wandbs_own_run(tmp_path):
    """WANDB_MODE=online: W&B's own run uploads each step as the flusher logs it (to a stand-in W&B
    server on 127.0.0.1), and no offline file of this package's is written."""
    script = tmp_path / "train.py"
    script.write_text(ONLINE_SCRIPT)
    server = _FakeWandbServer()
    try:
        env = dict(os.environ, WANDB_MODE="online", WANDB_BASE_URL=server.url, WANDB_API_KEY="a" * 40,
                   PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / "runs")], capture_output=True, text=True,
                              timeout=300, env=env, cwd=tmp_path)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert server.queries[0] == "UpsertBucket"
    assert [(line["_step"], line[LOSS]) for line in server.history] == [(s, s) for s in range(7)]
    assert [u.get("exitcode") for u in server.stream if u.get("complete")] == [0]
    assert not list((tmp_path / "runs").rglob("offline-run-*"))
