"""VisualDL hooks against the real VisualDL: reader, dashboard server, kill -9, host transfers."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, serving

import paddle_amp_ext as amp
from paddle_amp_ext.visualdl import TAGS
from paddle_amp_ext.visualdl_serve import command

pytest.importorskip("visualdl")
from visualdl import LogReader  # noqa: E402


def train(hook, steps=12, poison_at=(4,), flush_every=None):
    """Short training on the real scaler path; returns what the scaler reported per step."""
    model = make_mlp(seed=0)
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    reported = []
    scaler = amp.GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=3, hooks=[hook] if hook else [])
    scaler.add_hook(lambda e: reported.append((e.step, e.loss.item(), e.result.loss_scale, e.result.skipped,
                                               float(e.result.grad_norm) if e.result.grad_norm is not None else None)))
    x, y = make_data()
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        for step in range(steps):
            loss = paddle.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss * float("inf") if step in poison_at else loss).backward()
            scaler.step(opt, grad_clip=1.0)
            scaler.update()
            opt.clear_grad()
    return reported


def read(logdir: str) -> dict:
    files = glob.glob(os.path.join(logdir, "**", "vdlrecords.*"), recursive=True)
    assert len(files) == 1, files
    reader = LogReader(file_path=files[0])
    return {tag: [(d.id, d.value) for d in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]}


def test_one_point_per_step_with_the_values_the_scaler_reported(tmp_path):
    with amp.VisualDLHook(str(tmp_path / "run"), flush_every=5) as hook:
        reported = train(hook)
    data = read(str(tmp_path / "run"))
    assert set(data) == set(TAGS)
    assert [s for s, _ in data["amp/loss"]] == list(range(12))
    assert [v for _, v in data["amp/loss_scale"]] == [r[2] for r in reported]  # the raw scale: 1024, 2048, ...
    assert data["amp/loss_scale"][:4] == [(0, 1024.0), (1, 1024.0), (2, 1024.0), (3, 2048.0)]
    assert [2.0 ** v for _, v in data["amp/log2_loss_scale"]] == [r[2] for r in reported]
    assert [v for _, v in data["amp/skipped_steps"]] == [float(sum(r[3] for r in reported[:i + 1])) for i in range(12)]
    np.testing.assert_allclose([v for _, v in data["amp/loss"]], [r[1] for r in reported], rtol=1e-6)
    assert [s for s, _ in data["amp/grad_norm"]] == [r[0] for r in reported if r[4] is not None]
    assert data["amp/skipped_steps"][3:5] == [(3, 0.0), (4, 1.0)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:  # no Accept-Language, like curl
        return response.status, response.read()


def visualdl_server(logdir: str):
    port = _free_port()
    return serving("visualdl", command(logdir, port=port), port, lambda base: _get(base + "/app/api/runs")[0] == 200)


@pytest.mark.slow
def test_dashboard_serves_the_series_point_by_point(tmp_path):
    logdir = tmp_path / "runs"
    with amp.VisualDLHook(str(logdir / "exp"), flush_every=4) as hook:
        reported = train(hook, steps=10)
    with visualdl_server(str(logdir)) as base:
        status, body = _get(base + "/app/index")
        assert status == 200 and b"<html" in body.lower()
        tags = json.loads(_get(base + "/app/api/scalar/tags")[1])["data"]
        run = tags["runs"][0]
        assert run.endswith(os.path.relpath(hook.logdir, logdir)) and "exp/" in run
        assert {"amp/loss", "amp/log2_loss_scale"} <= set(tags["tags"][0])
        query = f"{base}/app/api/scalar/list?run={urllib.parse.quote(run)}&tag="
        losses = json.loads(_get(query + urllib.parse.quote("amp/loss"))[1])["data"]
        scales = json.loads(_get(query + urllib.parse.quote("amp/log2_loss_scale"))[1])["data"]
    assert [p[1] for p in losses] == [r[0] for r in reported]
    np.testing.assert_allclose([float(p[2]) for p in losses], [r[1] for r in reported], rtol=1e-6)  # inf is "inf"
    assert [2.0 ** float(p[2]) for p in scales] == [r[2] for r in reported]


def test_no_host_transfer_on_non_flush_steps(tmp_path, monkeypatch):
    calls = []
    for name in ("numpy", "item", "__float__", "tolist"):
        original = getattr(paddle.Tensor, name)

        def counting(self, *a, _original=original, _name=name, **k):
            if threading.current_thread() is threading.main_thread():  # the flusher's reads are its own thread's
                calls.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(paddle.Tensor, name, counting)

    def per_step(hook) -> list:
        model = make_mlp(seed=0)
        opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
        scaler = amp.GradScaler(init_loss_scaling=2.0**10, hooks=[hook] if hook else [])
        x, y = make_data()
        counts = []
        with amp.fp16_emulation(model, custom_black_list=["matmul"]):
            for _ in range(8):
                before = len(calls)
                scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
                scaler.step(opt, grad_clip=1.0)
                scaler.update()
                opt.clear_grad()
                counts.append(len(calls) - before)
        return counts

    baseline = per_step(None)
    hook = amp.VisualDLHook(str(tmp_path / "run"), flush_every=4)
    with_hook = per_step(hook)
    hook.close()
    assert baseline == [baseline[0]] * 8, "the scaler itself reads one flag per step"
    flush_steps = {3, 7}
    for step, (base, logged) in enumerate(zip(baseline, with_hook)):
        assert logged == base + (1 if step in flush_steps else 0), f"step {step}: {logged} vs {base}"


KILL_SCRIPT = textwrap.dedent('''
    import os, signal, sys
    import paddle
    import paddle_amp_ext as amp
    from paddle_amp_ext.events import StepEvent, StepResult
    hook = amp.VisualDLHook(sys.argv[1], flush_every=5)
    for step in range(23):
        hook.on_step(StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 8.0), None, 8.0))
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    # "exit": leave without close(); the hook flushes at interpreter exit
''')


@pytest.mark.parametrize("how, expected_steps", [("kill", 20), ("exit", 23)])
def test_logged_steps_survive_kill_and_exit(tmp_path, how, expected_steps):
    script = tmp_path / "train.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), how],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == (-signal.SIGKILL if how == "kill" else 0), proc.stderr
    data = read(str(tmp_path / "run"))
    recorded = len(data["amp/loss"])
    if how == "kill":  # flushed at step 20; the background flusher may have written the last 3 (it had 1 s)
        assert expected_steps <= recorded <= 23
        expected_steps = recorded
    assert [s for s, _ in data["amp/loss"]] == list(range(expected_steps))
    assert [v for _, v in data["amp/loss"]] == [float(s) for s in range(expected_steps)]


@pytest.mark.slow
def test_rank_zero_only_in_a_two_process_launch(tmp_path):
    from distributed import launch

    script = Path(__file__).parent / "dist_scripts" / "visualdl_ranks.py"
    launch(script, str(tmp_path), log_dir=tmp_path / "log")
    assert len(glob.glob(str(tmp_path / "default" / "*" / "vdlrecords.*"))) == 1
    assert not (tmp_path / "default" / "rank1").exists()
    (run,) = (tmp_path / "all").iterdir()  # one run directory, shared by both ranks
    assert sorted(p.name for p in run.iterdir()) == ["rank0", "rank1"]
    assert [s for s, _ in read(str(tmp_path / "default"))["amp/loss"]] == [0, 1, 2]
    assert [s for s, _ in read(str(run / "rank1"))["amp/loss"]] == [0, 1, 2]


def hapi_fit(callback) -> None:
    """Four batches of ``paddle.Model.fit`` with this package's scaler (scale 256) and ``callback``."""
    from paddle.io import TensorDataset

    x, y = make_data(n=32)
    net = make_mlp(seed=1)
    model = paddle.Model(net)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=net.parameters())
    model.prepare(opt, paddle.nn.MSELoss(), amp_configs={"level": "O1"})
    model._scaler = amp.GradScaler(init_loss_scaling=256.0)  # hapi keeps a scaler already set
    with amp.fp16_emulation(net, custom_black_list=["matmul"]):
        model.fit(TensorDataset([x, y]), batch_size=8, epochs=1, verbose=0, callbacks=[callback])


def test_hapi_callback_logs_the_same_tags(tmp_path):
    hapi_fit(amp.VisualDLCallback(str(tmp_path / "hapi"), flush_every=2))
    data = read(str(tmp_path / "hapi"))
    assert [s for s, _ in data["amp/loss"]] == [0, 1, 2, 3]
    assert [v for _, v in data["amp/log2_loss_scale"]] == [8.0] * 4
    assert [v for _, v in data["amp/loss_scale"]] == [256.0] * 4
    assert [v for _, v in data["amp/skipped_steps"]] == [0.0] * 4
    assert data["amp/lr"][0][1] == pytest.approx(0.01)


def test_hook_without_visualdl_names_the_extra(tmp_path):
    code = f"import sys; sys.modules['visualdl'] = None\nimport paddle_amp_ext as amp\namp.VisualDLHook({str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "pip install 'paddle-amp-ext[visualdl]'" in proc.stderr


def test_bad_flush_every_and_close_is_idempotent(tmp_path):
    with pytest.raises(ValueError, match="flush_every must be an int >= 1"):
        amp.VisualDLHook(str(tmp_path), flush_every=0)
    hook = amp.VisualDLHook(str(tmp_path / "x"))
    hook.close()
    hook.close()
    assert not hook.active


def test_launcher_passes_language_and_telemetry_flags():
    cmd = command("runs", port=9999)
    assert cmd[-9:] == ["--logdir", "runs", "--host", "127.0.0.1", "--port", "9999", "--language", "en",
                        "--disable-telemetry"]


def test_scalar_encoder_is_byte_identical_to_visualdl_protobuf():
    import struct

    from visualdl.proto.record_pb2 import Record

    from paddle_amp_ext.visualdl.records import ScalarEncoder as _ScalarEncoder

    values = [("amp/loss", 0.123456), ("amp/log2_loss_scale", 40.0), ("amp/skipped_steps", 1.0), ("amp/lr", float("inf")),
              ("标签/中文", -3.5)]
    for step, wall in [(0, 0), (127, 1795988211313), (300000, 2**40 + 5)]:
        expected = b""
        for tag, value in values:
            data = Record(values=[Record.Value(id=step, tag=tag, timestamp=wall, value=value)]).SerializeToString()
            expected += struct.pack("<Q", len(data)) + data
        assert _ScalarEncoder().step(step, wall, values) == expected


def test_launcher_cli_prints_the_command(capsys):
    from paddle_amp_ext.cli.visualdl import main

    assert main(["--logdir", "runs/x", "--port", "9001", "--print"]) == 0
    out = capsys.readouterr().out.split()
    assert out[-9:] == ["--logdir", "runs/x", "--host", "127.0.0.1", "--port", "9001", "--language", "en",
                        "--disable-telemetry"]
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.visualdl_serve", "--print"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--disable-telemetry" in proc.stdout
