"""The FP8 statistics as dashboard tags: the registry's family, ``Fp8Stats`` naming its tags from it,
and ``VisualDLHook.watch_fp8`` writing each scaler step's tags to every backend, read back with
each backend's own library."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import paddle
import pytest
from dashboard_readers import read_swanlab, read_tensorboard, read_visualdl, read_wandb

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import metrics
from paddle_amp_ext.fp8.stats import Fp8Stats

READERS = {"visualdl": read_visualdl, "tensorboard": read_tensorboard, "swanlab": read_swanlab, "wandb": read_wandb}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """W&B and SwanLab offline, their side files in the test's directory."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


# ---------------------------------------------------------------- the registry


def test_the_registry_holds_the_fp8_family_one_entry_per_quantity():
    assert metrics.FP8_QUANTITIES == ("saturated", "flushed", "amax", "scale_min", "scale_max")
    assert [m.name for m in metrics.FP8_METRICS] == [f"fp8/<layer>/<tensor>/{q}" for q in metrics.FP8_QUANTITIES]
    assert all(m.meaning and m.unit and m.when for m in metrics.FP8_METRICS)
    assert not any(name.startswith("fp8/") for name in metrics.NAMES)  # the AMP tags every step has
    assert metrics.fp8_tag("mlp.gate", "output_grad", "amax") == "fp8/mlp.gate/output_grad/amax"
    fp8 = metrics.markdown_table("fp8").splitlines()
    assert len(fp8) == 2 + 5 and fp8[2].startswith("| `fp8/<layer>/<tensor>/saturated` |")
    both = metrics.markdown_table().splitlines()
    assert both[2 + len(metrics.METRICS):] == fp8[2:] and both[:2 + len(metrics.METRICS)] == \
        metrics.markdown_table("amp").splitlines()
    assert all(line.count("|") == 6 for line in both)  # no meaning breaks the table's columns
    with pytest.raises(ValueError, match="family must be one of \\['amp', 'fp8'\\] or None. Received: family='FP8'"):
        metrics.markdown_table("FP8")


@pytest.mark.parametrize("layer", ["blocks/0", "my layer", "注意力.gate", "a" * 480])
def test_fp8_tag_keeps_slashes_spaces_and_unicode_unambiguous(layer):
    tag = metrics.fp8_tag(layer, "input", "flushed")
    assert tag == f"fp8/{layer}/input/flushed"
    assert tag[len("fp8/"):].rsplit("/", 2) == [layer, "input", "flushed"]


@pytest.mark.parametrize("args, error, match", [
    ((0, "input", "amax"), TypeError, "layer must be a string. Received: layer=0 \\(of type int\\)"),
    (("l", None, "amax"), TypeError, "tensor must be a string"),
    (("l", "input", b"amax"), TypeError, "quantity must be a string"),
    (("l", "Input", "amax"), ValueError, "tensor must be one of \\['input', 'weight', 'output_grad'\\]. "
                                         "Received: tensor='Input'"),
    (("l", "input", "max"), ValueError, "quantity must be one of .*'scale_max'\\]. Received: quantity='max'"),
    (("", "input", "amax"), ValueError, "layer='' \\(empty\\)"),
    (("a\nb", "input", "amax"), ValueError, "layer 'a\\\\nb' holds a control character"),
    (("a" * 500, "input", "amax"), ValueError, "more than the 512 SwanLab takes"),
])
def test_fp8_tag_refuses_what_no_dashboard_could_hold(args, error, match):
    with pytest.raises(error, match=match):
        metrics.fp8_tag(*args)


def test_the_docs_hook_renders_each_family_from_the_registry():
    spec = importlib.util.spec_from_file_location("_docs_metrics_hook", ROOT / "docs" / "hooks" / "metrics.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = "a\n<!-- metrics-table -->\nb\n<!-- metrics-table:fp8 -->\nc\n<!--metrics-table:amp-->\n"
    out = hook.on_page_markdown(page)
    assert "metrics-table" not in out
    assert out.count("`fp8/<layer>/<tensor>/amax`") == 2 and out.count("`amp/loss_scale`") == 2
    with pytest.raises(ValueError, match="family must be one of"):
        hook.on_page_markdown("<!-- metrics-table:nope -->")
    for doc, marker in (("dashboards.md", "<!-- metrics-table -->"), ("fp8.md", "<!-- metrics-table:fp8 -->")):
        assert marker in (ROOT / "docs" / doc).read_text(encoding="utf-8"), doc


# ---------------------------------------------------------------- Fp8Stats


def _record(stats, layer, role, sat, amax, scales=(1.0,)):
    stats.add_counts(layer, role, "e4m3fn", sat, 0, 100, amax, np.array(scales, np.float32))


def test_scalars_reduce_a_tensor_quantized_twice_in_a_step_to_its_worst():
    """A model called twice in a step: the worst fraction, the largest amax, the scales' whole range
    (on main the last call's values overwrote the first's)."""
    stats = Fp8Stats()
    _record(stats, "0", "input", 30, 500.0, (0.5, 2.0))
    _record(stats, "0", "input", 10, float("nan"), (4.0,))
    assert stats.scalars(0) == {"fp8/0/input/saturated": 0.3, "fp8/0/input/flushed": 0.0, "fp8/0/input/amax": 500.0,
                                "fp8/0/input/scale_min": 0.5, "fp8/0/input/scale_max": 4.0}
    stats.next_step()
    _record(stats, "0", "input", 0, float("nan"), (np.inf,))
    _record(stats, "0", "input", 0, float("inf"), ())
    step1 = stats.scalars()
    assert step1["fp8/0/input/amax"] == math.inf and math.isnan(step1["fp8/0/input/scale_min"])
    assert stats.summary()[0]["amax"] == math.inf and stats.summary()[0]["scale_min"] == 0.5


def test_end_step_takes_each_record_once_by_position():
    stats = Fp8Stats()
    _record(stats, "a", "input", 1, 1.0)
    values, since = stats.end_step(0)
    assert since == 1 and stats.step == 1 and values["fp8/a/input/saturated"] == 0.01
    assert stats.end_step(since) == ({}, 1) and stats.step == 2  # a step without records: no tags
    for bad, error in ((True, TypeError), (1.0, TypeError), (-1, ValueError), (2, ValueError)):
        with pytest.raises(error, match="since must be"):
            stats.end_step(bad)


def test_step_start_is_the_first_record_of_the_step_in_progress():
    stats = Fp8Stats()
    assert stats.step_start() == 0
    _record(stats, "a", "input", 1, 1.0)
    _record(stats, "a", "weight", 1, 1.0)
    assert stats.step_start() == 0
    stats.next_step()
    assert stats.step_start() == 2
    _record(stats, "a", "input", 1, 1.0)
    assert stats.step_start() == 2 and stats.end_step(stats.step_start())[1] == 3


def test_a_layer_whose_name_cannot_be_a_tag_is_left_out_with_a_warning(caplog):
    stats = Fp8Stats()
    _record(stats, "bad\tname", "weight", 1, 1.0)
    _record(stats, "good", "weight", 1, 1.0)
    assert sorted(stats.scalars()) == [f"fp8/good/weight/{q}" for q in sorted(metrics.FP8_QUANTITIES)]
    assert "layer 'bad\\tname' has no dashboard tags" in caplog.text


def test_removed_helpers_are_gone():
    import paddle_amp_ext.fp8.stats as module

    assert not hasattr(module, "measure") and not hasattr(Fp8Stats, "add")


# ---------------------------------------------------------------- through the hook


def _model(names=("0", "1")):
    paddle.seed(0)
    model = paddle.nn.Layer()
    for name in names:
        model.add_sublayer(name, paddle.nn.Linear(8, 8))
    return model


def _forward(model, x):
    for layer in model.children():
        x = layer(x)
    return x


def _train(model, hook, steps=5, poison_at=(2,), twice_at=(3,), stats=None, fp8_off_at=()):
    """A few scaler steps under fp8_linears (a poisoned step the scaler skips, a step that calls
    the model twice, steps with FP8 off); returns the stats."""
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**4, hooks=[hook])
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(4, 8)).astype("float32") * 300)
    stats = stats if stats is not None else Fp8Stats()
    hook.watch_fp8(stats)
    for step in range(steps):
        with (amp.fp8_linears(model, "delayed", stats=stats, record=step not in fp8_off_at)):
            loss = _forward(model, x).mean()
            if step in twice_at:
                loss = loss + _forward(model, x * 1000).mean()
        scaler.scale(loss * float("inf") if step in poison_at else loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
    return stats


def _same(a, b):
    return float(np.float32(a)) == float(np.float32(b)) or (math.isnan(a) and math.isnan(b))


def _check_fp8_tags(data, stats, steps, without=()):
    """Every step's FP8 tags read back equal ``stats.scalars(step)`` (as float32); none in ``without``."""
    series = {tag: dict(points) for tag, points in data.items() if tag.startswith("fp8/")}
    expected_tags = set()
    for step in range(steps):
        expected = stats.scalars(step) if step not in without else {}
        expected_tags |= set(expected)
        got = {tag: points[step] for tag, points in series.items() if step in points}
        assert set(got) == set(expected), step
        assert all(_same(got[tag], expected[tag]) for tag in expected), (step, got, expected)
    assert set(series) == expected_tags and expected_tags


def test_each_steps_fp8_tags_reach_visualdl_and_tensorboard_at_the_scalers_step(tmp_path):
    """Records of the skipped step 2 and of the model called twice in step 3 are written at those
    steps; the stats' own steps end with the scaler's."""
    model = _model()
    with amp.VisualDLHook(str(tmp_path), report_to=["visualdl", "tensorboard"], run_name="r", flush_every=2,
                          flush_secs=0.01) as hook:
        stats = _train(model, hook)
    assert stats.step == 5 and {r.step for r in stats.records} == set(range(5))
    assert len([r for r in stats.records if r.step == 3]) == 2 * len([r for r in stats.records if r.step == 1])
    for backend in ("visualdl", "tensorboard"):
        data = READERS[backend](hook.logdir)
        assert set(metrics.NAMES) - {metrics.GRAD_NORM.name} <= set(data), backend
        assert [s for s, _ in data[metrics.SKIPPED_STEPS.name]] == list(range(5))
        _check_fp8_tags(data, stats, 5)
        assert data["fp8/0/input/saturated"][3][1] > data["fp8/0/input/saturated"][1][1]  # the second call's worst


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["swanlab", "wandb"])
def test_each_steps_fp8_tags_reach_swanlab_and_wandb(tmp_path, backend, monkeypatch):
    pytest.importorskip(backend)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model = _model(("blocks/0", "注意力 gate"))
    with amp.VisualDLHook(str(tmp_path), report_to=[backend], run_name="r") as hook:
        stats = _train(model, hook, steps=3, poison_at=(1,), twice_at=())
    _check_fp8_tags(READERS[backend](hook.logdir), stats, 3)


def test_layer_names_with_slashes_spaces_and_unicode_and_non_finite_amax(tmp_path):
    model = _model(("blocks/0", "my layer", "注意力"))
    with amp.VisualDLHook(str(tmp_path), report_to=["visualdl", "tensorboard"], run_name="r") as hook:
        stats = _train(model, hook, steps=3, poison_at=(), twice_at=())
        hook.flush()
        x = paddle.to_tensor([[float("inf")] + [1.0] * 7, [float("nan")] * 8])
        with amp.fp8_linears(model, "current", stats=stats):
            _forward(model, x)
        hook.on_step(_event(3))
    assert stats.scalars(3)["fp8/blocks/0/input/amax"] == math.inf
    for backend in ("visualdl", "tensorboard"):
        data = READERS[backend](hook.logdir)
        assert {"fp8/my layer/weight/amax", "fp8/注意力/output_grad/flushed"} <= set(data)
        _check_fp8_tags(data, stats, 4)


def _event(step):
    return amp.StepEvent(step, None, amp.StepResult(False, 1.0), None, 1.0)


def test_no_fp8_records_in_a_step_no_fp8_tags_that_step(tmp_path):
    model = _model()
    with amp.VisualDLHook(str(tmp_path), run_name="r") as hook:
        stats = _train(model, hook, steps=4, poison_at=(), twice_at=(), fp8_off_at=(1, 2))
    assert stats.step == 4 and {r.step for r in stats.records} == {0, 3}
    data = read_visualdl(hook.logdir)
    assert [s for s, _ in data[metrics.LOSS_SCALE.name]] == [0, 1, 2, 3]
    _check_fp8_tags(data, stats, 4, without=(1, 2))


def test_user_calling_next_step_too_loses_and_doubles_nothing(tmp_path):
    """The hook takes records by position: a program that still calls stats.next_step() after each
    step (as the docs said before) gets each step's records once, at the scaler's step."""
    stats, written = Fp8Stats(), []
    with amp.VisualDLHook(str(tmp_path), run_name="r") as hook:
        hook.watch_fp8(stats)
        for step in range(3):
            _record(stats, "0", "input", step, float(step))
            hook.on_step(_event(step))
            stats.next_step()
            written.append(step)
    data = read_visualdl(hook.logdir)
    assert data["fp8/0/input/amax"] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert stats.step == 6


def test_watch_fp8_refuses_wrong_stats_and_a_closed_hook(tmp_path):
    hook = amp.VisualDLHook(str(tmp_path), run_name="r")
    first, other = Fp8Stats(), Fp8Stats()
    with pytest.raises(TypeError, match="stats must be the Fp8Stats that fp8_linears yields .* Received: \\{\\} "
                                        "\\(of type dict\\)"):
        hook.watch_fp8({})
    _record(first, "old", "input", 1, 1.0)  # a step ended before watching: not written
    first.next_step()
    _record(first, "mine", "input", 0, 0.5)  # the step in progress when the hook starts: written with it
    hook.watch_fp8(first)
    hook.watch_fp8(first)  # the same again: nothing changes
    with pytest.raises(ValueError, match="watches another Fp8Stats already"):
        hook.watch_fp8(other)
    _record(other, "other", "input", 1, 1.0)  # another model's stats, not watched: not written
    _record(first, "mine", "input", 1, 1.0)
    hook.on_step(_event(0))
    hook.watch_fp8(None)
    _record(first, "mine", "input", 2, 2.0)
    hook.on_step(_event(1))
    hook.close()
    data = read_visualdl(hook.logdir)
    assert sorted(tag for tag in data if tag.startswith("fp8/")) == sorted(
        f"fp8/mine/input/{q}" for q in metrics.FP8_QUANTITIES)
    assert data["fp8/mine/input/amax"] == [(0, 1.0)]
    with pytest.raises(ValueError, match="is closed"):
        hook.watch_fp8(first)
    step = first.step
    hook.on_step(_event(2))  # a closed hook: the stats are left alone
    assert first.step == step


def test_a_rank_that_does_not_log_still_ends_the_stats_steps(tmp_path, monkeypatch):
    from paddle_amp_ext.visualdl import hook as hook_module

    monkeypatch.setattr(hook_module, "_rank", lambda: (1, 2))
    hook = amp.VisualDLHook(str(tmp_path), run_name="r")
    assert not hook.active
    stats = Fp8Stats()
    hook.watch_fp8(stats)
    _record(stats, "0", "input", 1, 1.0)
    hook.on_step(_event(0))
    assert stats.step == 1 and hook._fp8_since == 1


@pytest.mark.slow
@pytest.mark.parametrize("variable, toolkit", [("PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "paddleformers"),
                                               ("PADDLE_AMP_EXT_PADDLENLP_PYTHON", "paddlenlp")])
def test_amp_callback_writes_each_trainer_steps_fp8_tags(tmp_path, variable, toolkit):
    """A real Trainer under fp8_linears with AmpCallback.watch_fp8: its hook, attached in the middle
    of the first step (float32: the guard), writes every step's tags, step 0's whole."""
    from helpers import run_trainer_check

    data, _ = run_trainer_check(variable, "trainer_fp8_check.py", tmp_path)
    assert data["toolkit"] == toolkit and data["stats_steps"] == 3
    records = data["records"]
    assert [s for s, _ in records["amp/skipped_steps"]] == [0, 1, 2]
    for step, expected in data["scalars"].items():
        got = {tag: dict(points)[int(step)] for tag, points in records.items() if tag.startswith("fp8/")}
        assert got.keys() == expected.keys() and len(got) >= 15, step
        assert all(got[t] == expected[t] or float(np.float32(expected[t])) == got[t] for t in expected), step


def test_records_made_in_another_thread_are_each_written_once(tmp_path):
    """A thread records while the training thread ends steps and the background flusher writes:
    every record lands in exactly one step, none lost, none twice."""
    import threading
    import time

    stats, count = Fp8Stats(), 1500
    done = threading.Event()

    def record():
        for i in range(count):
            _record(stats, f"l{i}", "input", 1, float(i))
            if i % 100 == 0:
                time.sleep(0.001)  # let the training thread end steps in between
        done.set()

    with amp.VisualDLHook(str(tmp_path), run_name="r", flush_every=3, flush_secs=0.001) as hook:
        hook.watch_fp8(stats)
        worker = threading.Thread(target=record)
        worker.start()
        step = 0
        while not done.is_set() or step == 0:
            hook.on_step(_event(step))
            step += 1
        worker.join()
        hook.on_step(_event(step))
    data = read_visualdl(hook.logdir)
    amax = {tag: points for tag, points in data.items() if tag.endswith("/amax")}
    assert len(amax) == count and all(len(points) == 1 for points in amax.values())
    assert sorted(points[0][1] for points in amax.values()) == [float(i) for i in range(count)]
    assert stats.step == step + 1


def test_write_fp8_stats_writes_a_finished_runs_steps(tmp_path):
    """run_script_fp8's stats (the doctor's), written at once through the same writers."""
    from paddle_amp_ext.visualdl import write_fp8_stats

    script = tmp_path / "train.py"
    script.write_text("import paddle\nmodel = paddle.nn.Sequential(paddle.nn.Linear(8, 8))\n"
                      "for _ in range(3):\n    model(paddle.randn([4, 8]) * 1000).mean().backward()\n")
    run = amp.fp8.run_script_fp8(str(script), [], "delayed")
    assert run.exit_code == 0 and run.stats.step == 2
    logdir = write_fp8_stats(run.stats, str(tmp_path / "runs"), report_to=["visualdl", "tensorboard"],
                             run_name="doctor")
    assert logdir == str(tmp_path / "runs" / "doctor")
    for backend in ("visualdl", "tensorboard"):
        _check_fp8_tags(READERS[backend](logdir), run.stats, 3)
    with pytest.raises(TypeError, match="stats must be an Fp8Stats .* Received: None"):
        write_fp8_stats(None, str(tmp_path / "runs"))
    assert write_fp8_stats(Fp8Stats(), str(tmp_path / "runs"), run_name="empty") is None  # no record: nothing made
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["doctor"]


@pytest.mark.parametrize("backend", ["visualdl", "tensorboard", "swanlab", "wandb"])
def test_nan_and_inf_values_reach_every_backend(tmp_path, backend, monkeypatch):
    """An all-NaN tensor (amax NaN, no finite scale) and an infinite one (amax inf, scale 0)."""
    pytest.importorskip({"visualdl": "visualdl", "tensorboard": "tensorboard"}.get(backend, backend))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    stats = Fp8Stats()
    with amp.VisualDLHook(str(tmp_path), report_to=[backend], run_name="r") as hook:
        hook.watch_fp8(stats)
        stats.add_counts("nan", "input", "e4m3fn", 0, 0, 4, float("nan"), np.array([np.nan, np.inf], np.float32))
        stats.add_counts("inf", "weight", "e4m3fn", 4, 0, 4, float("inf"), np.array([0.0], np.float32))
        hook.on_step(_event(0))
    data = READERS[backend](hook.logdir)
    assert math.isnan(data["fp8/nan/input/amax"][0][1]) and math.isnan(data["fp8/nan/input/scale_min"][0][1])
    assert data["fp8/inf/weight/amax"] == [(0, math.inf)] and data["fp8/inf/weight/saturated"] == [(0, 1.0)]
    _check_fp8_tags(data, stats, 1)
