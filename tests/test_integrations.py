"""Routing paddle.amp for code you do not own, `python -m paddle_amp_ext.run`, hapi with AMP on."""

from __future__ import annotations

import glob
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat
from paddle_amp_ext.integrations import active_routing

ORIGINALS = {name: getattr(paddle.amp, name) for name in ("GradScaler", "AmpScaler", "auto_cast", "decorate")}


def test_routing_replaces_and_restores_paddle_amp():
    with amp.routed() as routing:
        assert paddle.amp.GradScaler is not ORIGINALS["GradScaler"]
        scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
        assert isinstance(scaler, amp.GradScaler) and isinstance(scaler, ORIGINALS["GradScaler"])
        assert routing.scalers == [scaler]
        with pytest.raises(ValueError, match="Did you mean 'softmax'"):
            paddle.amp.auto_cast(custom_black_list=["softmx"])
        with pytest.raises(ValueError, match="decorate level must be"):
            paddle.amp.decorate(paddle.nn.Linear(2, 2), level="O3")
        assert isinstance(paddle.amp.AmpScaler(), amp.AmpScaler)
        assert list(inspect.signature(paddle.amp.auto_cast).parameters)[:6] == list(
            inspect.signature(ORIGINALS["auto_cast"]).parameters)[:6]
    assert {name: getattr(paddle.amp, name) for name in ORIGINALS} == ORIGINALS


def test_routings_nest_and_end_in_any_order():
    outer = amp.route(amp.AmpConfig(max_consecutive_skips=7))
    inner = amp.route(amp.AmpConfig(max_consecutive_skips=9))
    assert active_routing() is inner and paddle.amp.GradScaler()._max_consecutive_skips == 9
    outer.undo()  # not the innermost: paddle.amp stays routed for the inner one
    assert paddle.amp.GradScaler is inner.replacements["GradScaler"]
    assert active_routing() is inner and paddle.amp.GradScaler()._max_consecutive_skips == 9
    amp.unroute()
    assert {name: getattr(paddle.amp, name) for name in ORIGINALS} == ORIGINALS
    amp.unroute()  # nothing routed: nothing to do


def test_a_second_undo_is_named():
    routing = amp.route()
    routing.undo()
    with pytest.raises(RuntimeError, match=r"This routing was undone already \(a second undo\(\)"):
        routing.undo()
    with amp.routed() as block:
        pass
    with pytest.raises(RuntimeError, match="undone already"):
        block.undo()
    assert {name: getattr(paddle.amp, name) for name in ORIGINALS} == ORIGINALS


def test_routings_from_two_threads_overlap_and_restore_paddle_amp():
    """Each thread enters, waits until the other has entered, builds a scaler, leaves in the
    opposite order to the way a single stack would need: no error, each thread's scalers get
    its own config, and paddle.amp is Paddle's again after both left."""
    import threading

    entered, first_left = threading.Barrier(2), threading.Event()
    results, errors = {}, []

    def worker(name, skips, leave_first):
        try:
            with amp.routed(amp.AmpConfig(max_consecutive_skips=skips), on_scaler=lambda s: None) as routing:
                entered.wait(timeout=30)
                if not leave_first:
                    first_left.wait(timeout=30)
                    results[name + " after the other left"] = paddle.amp.GradScaler is not ORIGINALS["GradScaler"]
                built = paddle.amp.GradScaler()
                results[name] = (built._max_consecutive_skips, routing.scalers == [built])
            if leave_first:
                first_left.set()
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=("first", 3, False)),  # entered first, leaves last
               threading.Thread(target=worker, args=("second", 5, True))]
    threads[0].start()
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert results == {"first": (3, True), "second": (5, True), "first after the other left": True}
    assert {name: getattr(paddle.amp, name) for name in ORIGINALS} == ORIGINALS
    assert active_routing() is None


def test_a_thread_started_inside_a_routed_block_uses_that_routing():
    import threading

    built = []
    with amp.routed(amp.AmpConfig(max_consecutive_skips=4)) as routing:
        thread = threading.Thread(target=lambda: built.append(paddle.amp.GradScaler()))
        thread.start()
        thread.join(30)
        assert routing.scalers == built and built[0]._max_consecutive_skips == 4


def test_a_config_applies_every_key_it_sets_and_leaves_the_rest_to_the_caller(caplog):
    config = amp.AmpConfig(custom_black_list=["softmax"], max_consecutive_skips=3, on_collapse="raise",
                           init_loss_scaling=2.0**12, incr_every_n_steps=7)
    built = []
    with amp.routed(config, on_scaler=built.append):
        default = paddle.amp.GradScaler()
        explicit = paddle.amp.GradScaler(True, 2.0**5, max_consecutive_skips=5, decr_ratio=0.25)  # positional too
        with paddle.amp.auto_cast(custom_black_list={"reduce_sum"}):  # a set, as PaddleFormers passes
            _, black = _compat.tracer_op_lists()
    assert built == [default, explicit]
    for scaler in built:  # the config's keys, whatever the script passed
        assert (scaler._max_consecutive_skips, scaler._on_collapse) == (3, "raise")
        assert (scaler.state_dict()["scale"][0], scaler._incr_every_n_steps) == (2.0**12, 7)
    assert explicit._decr_ratio == 0.25, "a key the config leaves at its default stays the caller's"
    assert {"softmax", "reduce_sum"} <= black, "op lists are merged"
    replaced = sorted(r.getMessage() for r in caplog.records if "replaces" in r.getMessage())
    assert replaced == [
        "The AMP config's init_loss_scaling=4096.0 replaces the init_loss_scaling=32.0 passed to paddle.amp.GradScaler.",
        "The AMP config's max_consecutive_skips=3 replaces the max_consecutive_skips=5 passed to "
        "paddle.amp.GradScaler."]


def _kept(model):
    from paddle_amp_ext.keep import is_kept_fp32

    return sorted(name for name, layer in model.named_sublayers() if is_kept_fp32(layer))


def test_a_configs_fp32_layers_are_kept_in_the_first_called_model_or_the_decorated_one():
    def net():
        return paddle.nn.Sequential(paddle.nn.Linear(2, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 2))

    config = amp.AmpConfig(fp32_layers=["2"])
    first, second = net(), net()
    with amp.routed(config):
        first(paddle.ones([1, 2]))  # the first top-level layer call: the model doctor --advise measured
        second(paddle.ones([1, 2]))
    assert (_kept(first), _kept(second)) == (["2"], [])
    assert paddle.nn.Layer.__call__ is ORIGINALS_CALL
    decorated, called = net(), net()
    with amp.routed(config):
        paddle.amp.decorate(decorated, level="O1")
        called(paddle.ones([1, 2]))
    assert (_kept(decorated), _kept(called)) == (["2"], [])
    with amp.routed(amp.AmpConfig(fp32_layers=["head"])):  # a valid script runs; the routing's end warns
        net()(paddle.ones([1, 2]))
    assert paddle.nn.Layer.__call__ is ORIGINALS_CALL


ORIGINALS_CALL = paddle.nn.Layer.__call__


def test_routed_paddle_loop_skips_nan_steps_that_paddle_would_apply():
    """Paddle's documented loop, unmodified, on a CPU: routed, the NaN step does not reach the weights."""
    def loop():
        paddle.seed(0)
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        scaler = paddle.amp.GradScaler()
        for poison in (False, True, False):
            with paddle.amp.auto_cast():
                loss = model(paddle.ones([2, 4])).mean() * (float("nan") if poison else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
        return model.weight.numpy()

    assert not np.isfinite(loop()).all(), "the control: Paddle applies NaN gradients on a CPU"
    with amp.routed():
        assert np.isfinite(loop()).all()


SCRIPT = """
import sys
import numpy as np
import paddle

paddle.seed(0)
model = paddle.nn.Linear(4, 1)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=1024)     # the script's own, unmodified
for step in range(6):
    with paddle.amp.auto_cast():
        loss = model(paddle.ones([2, 4])).mean()
    scaler.scale(loss * (float("nan") if step == 3 else 1.0)).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
print("finite", bool(np.isfinite(model.weight.numpy()).all()))
sys.exit(4)
"""


@pytest.mark.slow
def test_run_an_unmodified_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--logdir", str(tmp_path / "runs"), "--json",
                           str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "finite True" in lines
    summary = json.loads(lines[-1])
    (scaler,) = summary["scalers"]
    assert (scaler["steps"], scaler["skipped"], summary["exit_code"]) == (6, 1, 4)
    assert scaler["loss_scale_min"] == scaler["loss_scale_max"] == 1.0, "loss scaling is off on a CPU"
    assert glob.glob(os.path.join(scaler["logdir"], "vdlrecords.*"))
    text = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--no-log", str(script)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert text.returncode == 4 and "GradScaler 0: 6 steps, 1 skipped, loss scale 1..1" in text.stderr
    usage = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", str(tmp_path / "missing.py")],
                           capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2 and "No such script" in usage.stderr


# --------------------------------------------------------------------------- hapi
def test_hapi_amp_configs_has_only_keys_hapi_accepts():
    configs = amp.hapi_amp_configs(amp.AmpConfig(dtype="bfloat16", custom_black_list=["softmax"]))
    assert "dtype" not in configs and configs["level"] == "O1" and configs["custom_black_list"] == ["softmax"]
    model = paddle.Model(paddle.nn.Linear(2, 2))
    opt = paddle.optimizer.SGD(parameters=model.parameters())
    model.prepare(opt, paddle.nn.MSELoss(), amp_configs=configs)  # accepted as is, on both versions
    with pytest.raises(ValueError, match=r"does not accept \['dtype'\]. hapi has no dtype key"):
        amp.hapi_amp_configs(level="O1", dtype="float16")
    assert amp.hapi_amp_configs(enabled=False) is None


def test_hapi_fit_with_amp_on_as_a_t4_would_run_it(tmp_path, monkeypatch):
    """The gate answering as a Tesla T4 (float16 + loss scaling), fp16 rehearsal on this CPU."""
    from visualdl import LogReader

    from paddle_amp_ext import device
    from paddle_amp_ext.gate import DeviceInfo

    t4 = DeviceInfo(index=0, name="Tesla T4", compute_capability=(7, 5), total_memory_bytes=16 * 2**30)
    monkeypatch.setattr(device, "probe_report", lambda: device.ProbeReport("x", "11.8", "8", (t4,)))
    device.current_decision.cache_clear()
    decision = device.current_decision("auto")
    assert (decision.dtype, decision.use_loss_scaling) == ("float16", True)

    paddle.seed(0)
    x = paddle.randn([96, 8])
    y = x[:, :2].argmax(axis=1).unsqueeze(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 2))
    model = paddle.Model(net)
    config = amp.AmpConfig(dtype=decision.dtype, init_loss_scaling=2.0**24, max_consecutive_skips=50)
    model.prepare(paddle.optimizer.Adam(learning_rate=1e-3, parameters=net.parameters()), paddle.nn.CrossEntropyLoss(),
                  amp_configs=amp.hapi_amp_configs(config))
    callback = amp.VisualDLCallback(str(tmp_path), flush_every=2)
    with amp.routed(config) as routing, amp.fp16_emulation(net):
        model.fit(paddle.io.TensorDataset([x, y]), batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    (scaler,) = routing.scalers
    assert _compat.hapi_scaler(model) is scaler
    assert scaler.skipped_steps >= 1, "2**24 overflows fp16 at first: the scaler backed off"
    assert scaler.loss_scale < 2.0**24
    (path,) = glob.glob(os.path.join(callback.logdir, "vdlrecords.*"))
    reader = LogReader(file_path=path)
    tags = set(reader.get_tags()["scalar"])
    assert tags == {"amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/grad_norm", "amp/lr"}
    scales = [d.value for d in reader.get_data("scalar", "amp/log2_loss_scale")]
    assert scales[0] == 24.0 and scales[-1] < 24.0
    assert [d.value for d in reader.get_data("scalar", "amp/loss_scale")] == [2.0**s for s in scales]
    norms = [d.id for d in reader.get_data("scalar", "amp/grad_norm")]
    assert norms and 0 not in norms, "on stepped batches, from the second batch on"


def test_train_hapi_example_with_amp_on(tmp_path):
    example = Path(__file__).resolve().parent.parent / "examples" / "train_hapi.py"
    proc = subprocess.run([sys.executable, str(example), "--epochs", "1", "--samples", "128", "--dtype", "float16",
                           "--rehearse", "--logdir", "runs/h"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AMP: float16" in proc.stdout
    assert "scaler: paddle_amp_ext.scaler.GradScaler loss scaling on=True steps=2 skipped=0" in proc.stdout


@pytest.mark.slow
def test_a_rerun_into_the_same_logdir_shows_both_runs_in_visualdl(tmp_path):
    """VisualDL shows only the newest record file of a directory: each hook writes its own run."""
    from visualdl import LogReader

    from paddle_amp_ext.events import StepEvent, StepResult

    for _ in range(2):  # a re-run, and two hooks in the same second
        with amp.VisualDLHook(str(tmp_path / "runs")) as hook:
            hook.on_step(StepEvent(0, paddle.to_tensor(1.0), StepResult(False, 1.0), 0.1, 1.0))
    runs = LogReader(logdir=str(tmp_path / "runs")).runs()  # the run list the dashboard shows
    assert len(set(runs)) == 2 and all(glob.glob(os.path.join(run, "vdlrecords.*")) for run in runs)
