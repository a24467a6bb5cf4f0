"""report_to=: the hook, the hapi callback and ``run --report-to`` write the same steps to VisualDL,
TensorBoard, SwanLab and W&B, each read back with the backend's own library (and TensorBoard's
server answering its scalars API on loopback, as VisualDL's does in test_visualdl.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.parse
import urllib.request

import numpy as np
import pytest
from dashboard_readers import read_swanlab, read_tensorboard, read_visualdl, read_wandb, swanlab_records, wandb_records
from helpers import serving
from test_visualdl import _free_port, _get, hapi_fit, train

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import metrics

pytest.importorskip("visualdl")
READERS = {"visualdl": read_visualdl, "tensorboard": read_tensorboard, "swanlab": read_swanlab, "wandb": read_wandb}
LIBRARIES = {"tensorboard": "tensorboard", "swanlab": "swanlab", "wandb": "wandb"}


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """W&B and SwanLab offline, their side files in the test's directory, nothing sent anywhere."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))  # W&B's service log (outside the logdir)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _needs(*names):
    for name in names:
        if name in LIBRARIES:
            pytest.importorskip(LIBRARIES[name])


def as_float32(series):
    return [(step, float(np.float32(value))) for step, value in series]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorboard", "swanlab", "wandb"])
def test_each_backend_records_what_visualdl_records_step_for_step(tmp_path, backend):
    _needs(backend)
    with amp.VisualDLHook(str(tmp_path / "runs"), report_to=["visualdl", backend], flush_every=5,
                          run_name="exp") as hook:
        reported = train(hook)
    assert hook.logdir == str(tmp_path / "runs" / "exp")
    visualdl = read_visualdl(hook.logdir)
    assert set(visualdl) == set(metrics.NAMES)
    assert [s for s, _ in visualdl[metrics.LOSS.name]] == list(range(12))
    assert [v for _, v in visualdl[metrics.LOSS_SCALE.name]] == [r[2] for r in reported]
    other = READERS[backend](hook.logdir)
    assert set(other) == set(visualdl)
    for name in metrics.NAMES:
        assert as_float32(other[name]) == visualdl[name], name  # SwanLab and W&B keep float64: compared as float32
    outside = [str(p.relative_to(tmp_path / "home")) for p in (tmp_path / "home").rglob("*") if p.is_file()]
    assert [p for p in outside if not p.startswith(".cache/paddle_amp_ext/")] == []  # the rehearsal's kernel cache
    if backend == "wandb":
        assert not (tmp_path / "wandb-cache").exists(), "W&B's service process ran"

@pytest.mark.slow
def test_every_backend_at_once_one_run_directory(tmp_path):
    _needs("tensorboard", "swanlab", "wandb")
    hook = amp.VisualDLHook(str(tmp_path / "runs"), report_to="visualdl,tensorboard,swanlab,wandb", run_name="all")
    train(hook, steps=4)
    hook.close()
    hook.close()
    data = {name: read(hook.logdir) for name, read in READERS.items()}
    for name in ("tensorboard", "swanlab", "wandb"):
        assert {tag: as_float32(series) for tag, series in data[name].items()} == data["visualdl"], name
    assert sorted(os.listdir(tmp_path / "runs")) == ["all"]


def test_the_hook_logs_how_to_view_each_backend(tmp_path, caplog):
    """The start line names each backend's viewer, W&B's with the directory `wandb leet` browses
    and the offline run `wandb sync` uploads (both exist)."""
    caplog.set_level("INFO", logger="paddle_amp_ext")
    hook = amp.VisualDLHook(str(tmp_path / "runs"), report_to="tensorboard,wandb", run_name="exp")
    hook.close()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("AMP metrics: logging to")]
    runs = os.path.join(hook.logdir, "wandb")
    assert line == (f"AMP metrics: logging to {hook.logdir} for tensorboard, wandb; view with: tensorboard --logdir "
                    f"{tmp_path / 'runs'} --host 127.0.0.1; view with: wandb leet {runs} (W&B's terminal viewer; "
                    f"upload: wandb sync {os.path.join(runs, 'offline-run-*')})")
    (offline,) = os.listdir(runs)
    assert offline.startswith("offline-run-")


def tensorboard_server(logdir: str):
    port = _free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
               "--load_fast", "false", "--reload_interval", "1"]
    return serving("tensorboard", command, port, lambda base: bool(json.loads(_get(base + "/data/runs")[1])), 90)


@pytest.mark.slow
def test_tensorboard_server_serves_the_series_point_by_point(tmp_path):
    _needs("tensorboard")
    logdir = tmp_path / "runs"
    with amp.VisualDLHook(str(logdir), report_to="tensorboard", run_name="exp", flush_every=4) as hook:
        reported = train(hook, steps=10)
    with tensorboard_server(str(logdir)) as base:
        assert json.loads(_get(base + "/data/runs")[1]) == ["exp"]
        tags = json.loads(_get(base + "/data/plugin/scalars/tags")[1])
        assert set(tags["exp"]) == set(metrics.NAMES)
        query = base + "/data/plugin/scalars/scalars?run=exp&tag="
        losses = json.loads(_get(query + urllib.parse.quote(metrics.LOSS.name))[1])
        scales = json.loads(_get(query + urllib.parse.quote(metrics.LOSS_SCALE.name))[1])
    assert [p[1] for p in losses] == [r[0] for r in reported]
    np.testing.assert_allclose([float(p[2]) for p in losses], [r[1] for r in reported], rtol=1e-6)  # inf: "Infinity"
    assert [p[2] for p in scales] == [r[2] for r in reported]


def test_hapi_callback_reports_to_tensorboard(tmp_path):
    _needs("tensorboard")
    callback = amp.VisualDLCallback(str(tmp_path / "hapi"), flush_every=2, report_to=["tensorboard", "visualdl"])
    hapi_fit(callback)
    callback.close()
    board, vdl = read_tensorboard(str(tmp_path / "hapi")), read_visualdl(str(tmp_path / "hapi"))
    assert board == vdl
    assert [s for s, _ in board[metrics.LOSS.name]] == [0, 1, 2, 3]
    assert [v for _, v in board[metrics.LOSS_SCALE.name]] == [256.0] * 4


KILL_SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    import paddle
    import paddle_amp_ext as amp
    from paddle_amp_ext.events import StepEvent, StepResult
    hook = amp.VisualDLHook(sys.argv[1], report_to=sys.argv[3], flush_every=1000, flush_secs=0.2)
    for step in range(7):
        hook.on_step(StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 8.0), None, 8.0))
    if sys.argv[2] == "exit":  # at once, before the background flusher's first write: exit flushes
        sys.exit(0)
    if sys.argv[2] == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the background flusher writes every finished step within flush_secs
    os.kill(os.getpid(), signal.SIGKILL)
''')


@pytest.mark.parametrize("backend, how, status", [("tensorboard", "kill", -signal.SIGKILL),
                                                  ("tensorboard", "term", -signal.SIGTERM),
                                                  ("swanlab", "kill", -signal.SIGKILL),
                                                  ("swanlab", "term", -signal.SIGTERM),
                                                  ("wandb", "kill", -signal.SIGKILL),
                                                  ("wandb", "term", -signal.SIGTERM),
                                                  ("tensorboard", "exit", 0), ("swanlab", "exit", 0),
                                                  ("wandb", "exit", 0)])
def test_the_finished_steps_of_a_killed_job_are_kept(tmp_path, backend, how, status):
    """TensorBoard, W&B and SwanLab: the background flusher wrote every step (a SIGKILL loses none
    of them); a plain exit right after the last step flushes all."""
    _needs(backend)
    script = tmp_path / "train.py"
    script.write_text(KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(os.getcwd())] + sys.path))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), how, backend], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == status, proc.stderr
    data = READERS[backend](str(tmp_path / "run"))
    assert data[metrics.LOSS.name] == [(s, float(s)) for s in range(7)]
    assert data[metrics.LOSS_SCALE.name] == [(s, 8.0) for s in range(7)]
    if backend == "wandb":  # a run that ended without close() has no exit record: W&B syncs it as failed
        kinds = [r.WhichOneof("record_type") for r in wandb_records(str(tmp_path / "run"))]
        assert kinds[-1] == ("exit" if how == "exit" else "summary"), kinds
    if backend == "swanlab":  # without its finish record (killed) SwanLab syncs the run as crashed
        kinds = [r.WhichOneof("record_type") for r in swanlab_records(str(tmp_path / "run"))]
        assert kinds[-1] == ("finish" if how == "exit" else "scalar"), kinds


def test_run_report_to_writes_tensorboard_records(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import paddle
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
        for _ in range(3):
            loss = model(paddle.ones([2, 4])).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
    '''))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(os.getcwd())] + sys.path))
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--logdir", str(tmp_path / "runs"),
                           "--report-to", "tensorboard,visualdl", str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    board = read_tensorboard(str(run))
    assert board == read_visualdl(str(run))
    assert [v for _, v in board[metrics.LOSS_SCALE.name]] == [1.0] * 3  # Paddle's CPU build: loss scaling off
    assert [s for s, _ in board[metrics.LOSS.name]] == [0, 1, 2]


def test_run_report_to_refuses_an_unknown_backend(tmp_path):
    (tmp_path / "x.py").write_text("print('never run')\n")
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--report-to", "tensorbord", "x.py"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "Did you mean 'tensorboard'?" in proc.stderr and "never run" not in proc.stdout
