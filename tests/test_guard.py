"""guard_optimizer: the non-finite guard for loops that call optimizer.step() themselves."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import paddle
import pytest
from distributed import launch
from helpers import make_data, make_mlp, params_of
from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionLayer, MixPrecisionOptimizer

import paddle_amp_ext as amp
from paddle_amp_ext import AmpOverflowError, OptimizerGuard, StepEvent

SCRIPT = Path(__file__).parent / "dist_scripts" / "guard_nan_on_one_rank.py"


def backward(model, x, y, poison: bool = False) -> paddle.Tensor:
    loss = paddle.nn.functional.mse_loss(model(x), y)
    (loss * float("nan") if poison else loss).backward()
    return loss


def accumulators(opt) -> list:
    """The optimizer's state tensors (moments, beta powers), in state_dict order."""
    return [v.numpy().copy() for v in opt.state_dict().values() if isinstance(v, paddle.Tensor)]


def assert_same_arrays(mine: list, expected: list) -> None:
    assert len(mine) == len(expected) > 0
    for a, b in zip(mine, expected):
        np.testing.assert_array_equal(a, b)


class Recorder:
    def __init__(self):
        self.events, self.overflows = [], []

    def on_step(self, event):
        self.events.append(event)

    def on_overflow(self, event):
        self.overflows.append(event.step)


def test_a_nan_step_is_not_applied_counted_and_reported_and_clean_steps_match_control():
    x, y = make_data()
    model, control = make_mlp(seed=1), make_mlp(seed=1)
    opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    opt_c = paddle.optimizer.AdamW(learning_rate=0.01, parameters=control.parameters())
    hook = Recorder()
    guard = amp.guard_optimizer(opt, hooks=[hook])
    assert isinstance(guard, OptimizerGuard) and guard.optimizer is opt and guard.active
    returned = []
    for poison in (False, True, True, False, False):
        before, moments = params_of(model), accumulators(opt)
        backward(model, x, y, poison)
        returned.append(opt.step())
        opt.clear_grad()
        if not poison:
            backward(control, x, y)
            opt_c.step()
            opt_c.clear_grad()
        else:  # not applied: weights and the optimizer's moments and beta powers bit-identical
            for a, b in zip(before, params_of(model)):
                np.testing.assert_array_equal(a, b)
            assert_same_arrays(accumulators(opt), moments)
        for a, b in zip(params_of(model), params_of(control)):
            np.testing.assert_array_equal(a, b)
        assert guard.last_step_skipped is poison and guard.last_result.skipped is poison
    assert returned == [None] * 5
    assert guard.skipped_steps == 2 and guard.consecutive_skips == 0
    assert all(isinstance(e, StepEvent) for e in hook.events)
    assert [e.step for e in hook.events] == [0, 1, 2, 3, 4]
    assert [e.result.skipped for e in hook.events] == [False, True, True, False, False]
    assert hook.overflows == [1, 2]
    assert [e.result.loss_scale for e in hook.events] == [1.0] * 5
    assert [e.next_loss_scale for e in hook.events] == [1.0] * 5
    assert all(e.lr == 0.01 for e in hook.events)
    norms = [float(e.result.grad_norm) for e in hook.events]
    assert np.isnan(norms[1]) and np.isnan(norms[2]) and all(np.isfinite([norms[0], *norms[3:]]))
    assert_same_arrays(accumulators(opt), accumulators(opt_c))


def test_the_call_passes_its_arguments_and_returns_what_the_optimizer_returned():
    class Tagged(paddle.optimizer.SGD):
        def step(self, *args, **kwargs):
            super().step()
            return ("applied", args, kwargs)

    x, y = make_data()
    model = make_mlp(seed=2)
    opt = Tagged(learning_rate=0.1, parameters=model.parameters())
    amp.guard_optimizer(opt)
    backward(model, x, y)
    assert opt.step(1, key="v") == ("applied", (1,), {"key": "v"})
    opt.clear_grad()
    backward(model, x, y, poison=True)
    assert opt.step(2) is None


def test_guarding_twice_returns_the_same_guard_and_remove_restores_the_optimizer():
    x, y = make_data()
    model = make_mlp(seed=3)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    hook, other = Recorder(), Recorder()
    guard = amp.guard_optimizer(opt, hooks=[hook])
    assert amp.guard_optimizer(opt, hooks=[hook, other]) is guard
    assert guard.hooks == (hook, other)
    backward(model, x, y)
    opt.step()
    assert len(hook.events) == len(other.events) == 1  # one guard: one decision, one event
    with pytest.raises(ValueError, match=r"already guarded with max_consecutive_skips=None, on_collapse='warn'; "
                                         r"received max_consecutive_skips=3"):
        amp.guard_optimizer(opt, max_consecutive_skips=3)
    guard.remove()
    guard.remove()
    assert not guard.active and "step" not in vars(opt)
    opt.clear_grad()
    backward(model, x, y, poison=True)
    opt.step()  # unguarded again: the NaN reaches the weights (the control)
    assert not all(np.isfinite(p).all() for p in params_of(model))
    assert len(hook.events) == 1 and guard.skipped_steps == 0
    again = amp.guard_optimizer(opt, max_consecutive_skips=3)
    assert again is not guard and again.active
    again.remove()


def test_remove_restores_a_step_someone_else_replaced_before():
    model = make_mlp(seed=3)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    calls = []
    original = opt.step

    def counted_step():
        calls.append(1)
        original()

    opt.step = counted_step
    guard = amp.guard_optimizer(opt)
    x, y = make_data()
    backward(model, x, y)
    opt.step()
    assert calls == [1] and guard.skipped_steps == 0 and guard.last_result.skipped is False
    guard.remove()
    assert opt.step is counted_step


def test_as_a_context_manager_the_guard_ends_with_the_block():
    x, y = make_data()
    model = make_mlp(seed=3)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    with amp.guard_optimizer(opt) as guard:
        backward(model, x, y, poison=True)
        before = params_of(model)
        opt.step()
        for a, b in zip(before, params_of(model)):
            np.testing.assert_array_equal(a, b)
    assert guard.skipped_steps == 1 and not guard.active and "step" not in vars(opt)


def test_the_optimizers_state_dict_is_unchanged_and_the_guards_state_round_trips():
    x, y = make_data()
    model, twin = make_mlp(seed=4), make_mlp(seed=4)
    opt = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    opt_t = paddle.optimizer.Adam(learning_rate=0.01, parameters=twin.parameters())
    guard = amp.guard_optimizer(opt)
    for poison in (False, True):
        backward(model, x, y, poison)
        opt.step()
        opt.clear_grad()
    backward(twin, x, y)
    opt_t.step()
    names = {p.name: q.name for p, q in zip(model.parameters(), twin.parameters())}
    keys = sorted(opt.state_dict())
    for mine, theirs in names.items():
        keys = [k.replace(mine, theirs) for k in keys]
    assert sorted(keys) == sorted(opt_t.state_dict())
    assert_same_arrays(accumulators(opt), accumulators(opt_t))
    state = pickle.loads(pickle.dumps(guard.state_dict()))
    fresh = amp.guard_optimizer(paddle.optimizer.Adam(learning_rate=0.01, parameters=make_mlp().parameters()))
    fresh.load_state_dict(state)
    assert fresh.skipped_steps == 1 and fresh.consecutive_skips == 1


def test_fleets_mix_precision_optimizer_with_nan_in_main_grad():
    x, y = make_data()
    inner = make_mlp(seed=5)
    model = MixPrecisionLayer(inner, dtype="bfloat16")
    opt = MixPrecisionOptimizer(paddle.optimizer.AdamW(learning_rate=0.01, parameters=inner.parameters()))
    guard = amp.guard_optimizer(opt)
    for poison in (True, False):
        before = params_of(inner)
        backward(model, x, y, poison)
        assert inner[0].weight.grad is None  # the gradient is in main_grad only
        opt.step()
        opt.clear_grad()
        changed = [not np.array_equal(a, b) for a, b in zip(before, params_of(inner))]
        assert not any(changed) if poison else all(changed)
    assert guard.skipped_steps == 1 and float(guard.last_result.grad_norm) > 0


def test_consecutive_skips_raise_from_the_step_call_when_asked():
    x, y = make_data()
    model = make_mlp(seed=6)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    amp.guard_optimizer(opt, max_consecutive_skips=2, on_collapse="raise")
    backward(model, x, y, poison=True)
    opt.step()
    with pytest.raises(AmpOverflowError, match=r"2 consecutive steps had inf/nan gradients \(loss scaling off\)"):
        opt.step()


def test_a_step_that_raises_leaves_the_guard_usable():
    class FailsOnce(paddle.optimizer.SGD):
        failed = False

        def step(self):
            if not self.failed:
                self.failed = True
                raise RuntimeError("device lost")
            super().step()

    x, y = make_data()
    model = make_mlp(seed=7)
    opt = FailsOnce(learning_rate=0.1, parameters=model.parameters())
    hook = Recorder()
    guard = amp.guard_optimizer(opt, hooks=[hook])
    backward(model, x, y)
    with pytest.raises(RuntimeError, match="device lost"):
        opt.step()
    before = params_of(model)
    opt.step()
    assert all(not np.array_equal(a, b) for a, b in zip(before, params_of(model)))
    assert [e.step for e in hook.events] == [0] and guard.skipped_steps == 0


def test_record_loss_and_step_scheduler():
    x, y = make_data()
    model = make_mlp(seed=8)
    scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1, gamma=0.5)
    opt = paddle.optimizer.SGD(learning_rate=scheduler, parameters=model.parameters())
    hook = Recorder()
    guard = amp.guard_optimizer(opt, hooks=[hook])
    stepped = []
    for poison in (False, True):
        loss = guard.record_loss(paddle.nn.functional.mse_loss(model(x), y))
        (loss * float("nan") if poison else loss).backward()
        opt.step()
        opt.clear_grad()
        stepped.append(guard.step_scheduler(scheduler))
    assert stepped == [True, False] and scheduler.last_epoch == 1
    assert [e.loss is not None for e in hook.events] == [True, True]
    np.testing.assert_allclose(float(hook.events[0].loss), float(paddle.nn.functional.mse_loss(
        make_mlp(seed=8)(x), y)), rtol=1e-6)


def test_visualdl_hook_logs_the_guarded_steps(tmp_path):
    pytest.importorskip("visualdl")
    from test_visualdl import read

    x, y = make_data()
    model = make_mlp(seed=9)
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    with amp.VisualDLHook(str(tmp_path / "run"), flush_every=2) as hook, amp.guard_optimizer(opt, [hook]) as guard:
        for poison in (False, True, False):
            loss = guard.record_loss(paddle.nn.functional.mse_loss(model(x), y))
            (loss * float("nan") if poison else loss).backward()
            opt.step()
            opt.clear_grad()
    data = read(str(tmp_path / "run"))
    assert data["amp/skipped_steps"] == [(0, 0.0), (1, 1.0), (2, 1.0)]
    assert [s for s, _ in data["amp/loss"]] == [0, 1, 2] and [v for _, v in data["amp/lr"]] == [float(np.float32(0.05))] * 3
    assert data["amp/log2_loss_scale"] == [(0, 0.0), (1, 0.0), (2, 0.0)]


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match=r"needs an optimizer with a step\(\) method .*Received: 3 \(of type int\)"):
        amp.guard_optimizer(3)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=make_mlp().parameters())
    with pytest.raises(TypeError, match="hooks must be a list of hooks"):
        amp.guard_optimizer(opt, hooks="runs/x")
    assert "step" not in vars(opt)


@pytest.mark.slow
def test_nan_on_one_rank_is_skipped_on_every_rank_under_fleet(tmp_path):
    """Two processes: fleet's HybridParallelOptimizer guarded (its own step() and the Trainers'
    _step()), and fp32 master gradients with the scaler on, then guarded. Rank 1's NaN reaches
    every rank through the gradient all-reduce, so no found_inf all-reduce runs in the step."""
    import json

    launch(SCRIPT, str(tmp_path), log_dir=tmp_path / "log", timeout=150)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    fleet0, fleet1 = (r["fleet"] for r in ranks)
    assert fleet0["method"] == fleet1["method"] == "_step"
    assert fleet0["skipped"] == fleet1["skipped"] == [False, True, False, True]
    assert fleet0["skipped_steps"] == fleet1["skipped_steps"] == 2
    master0, master1 = (r["master_grad"] for r in ranks)
    assert master0["skipped"] == master1["skipped"] == [False, True] * 4
    assert master0["scales"] == master1["scales"] == [1024.0, 512.0, 512.0, 256.0]
    assert master0["guard_skipped_steps"] == master1["guard_skipped_steps"] == 2
    assert fleet0["collectives"] == fleet1["collectives"] == [0] * 4
    assert master0["collectives"] == master1["collectives"] == [0] * 8
    for part in ("fleet", "master_grad"):
        for a, b in zip(ranks[0][part]["params"], ranks[1][part]["params"]):
            np.testing.assert_array_equal(a, b)
        assert all(np.isfinite(p).all() for p in ranks[0][part]["params"])
