"""GradScaler on the real Paddle scaler machinery (check_finite_and_unscale, skip, update).

On a CPU the scaler runs for real inside fp16_emulation. Black-listing ``matmul`` keeps every
Linear in float32 there (no quantization), so a scaled run can be compared exactly with a plain
float32 control: scaling by powers of two is exact.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, params_of

import paddle_amp_ext as amp
from paddle_amp_ext import AmpOverflowError, StepResult


@contextlib.contextmanager
def scaler_machinery(model):
    """The real scaler path on a CPU, with no value quantized."""
    with amp.fp16_emulation(model, custom_black_list=["matmul"]) as emulated:
        assert emulated == []
        yield


def loss_of(model, x, y, poison: bool = False):
    loss = paddle.nn.functional.mse_loss(model(x), y)
    return loss * float("inf") if poison else loss


def twin_runs(steps, poison_at=(), clip=None, opt_cls=paddle.optimizer.SGD, **scaler_kwargs):
    """Control (fp32, optimizer clip) and scaled run (our scaler, step(grad_clip)) side by side."""
    x, y = make_data()
    control, scaled = make_mlp(seed=5), make_mlp(seed=5)
    opt_c = opt_cls(learning_rate=0.05, parameters=control.parameters(),
                    grad_clip=paddle.nn.ClipGradByGlobalNorm(clip) if clip else None)
    opt_s = opt_cls(learning_rate=0.05, parameters=scaled.parameters())
    scaler = amp.GradScaler(**scaler_kwargs)
    results, scales, history = [], [], []
    with scaler_machinery(scaled):
        for step in range(steps):
            poison = step in poison_at
            if not poison:
                loss_of(control, x, y).backward()
                opt_c.step()
            opt_c.clear_grad()
            before = params_of(scaled)
            scaler.scale(loss_of(scaled, x, y, poison)).backward()
            results.append(scaler.step(opt_s, grad_clip=clip))
            scaler.update()
            opt_s.clear_grad()
            scales.append(scaler.loss_scale)
            history.append((before, params_of(scaled), params_of(control)))
    return results, scales, history, scaler


def test_exact_scale_arithmetic_with_injected_overflows():
    results, scales, _, scaler = twin_runs(
        8, poison_at={3, 4}, init_loss_scaling=2.0**10, incr_every_n_steps=2)
    # steps 0,1 finite -> x2; 2 finite; 3,4 inf -> /2 each (and reset the growth count); 5,6 -> x2; 7
    assert [r.loss_scale for r in results] == [2**10, 2**10, 2**11, 2**11, 2**10, 2**9, 2**9, 2**10]
    assert scales == [2**10, 2**11, 2**11, 2**10, 2**9, 2**9, 2**10, 2**10]
    assert [r.skipped for r in results] == [False, False, False, True, True, False, False, False]
    assert scaler.skipped_steps == 2 and scaler.consecutive_skips == 0
    init, incr, decr = 2.0**10, 2.0, 0.5
    assert scaler.loss_scale == init * incr**2 * decr**2  # k=2 growths, j=2 decreases


def test_skipped_steps_leave_parameters_bit_identical_and_runs_match_control():
    _, _, history, _ = twin_runs(6, poison_at={2}, opt_cls=paddle.optimizer.Adam, init_loss_scaling=2.0**12)
    before, after, _ = history[2]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    for _, scaled, control in history:
        for a, b in zip(scaled, control):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_clipped_update_equals_control_clipped_by_the_same_rule():
    results, _, history, _ = twin_runs(4, clip=0.05, init_loss_scaling=2.0**8)
    for _, scaled, control in history:
        for a, b in zip(scaled, control):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert all(r.grad_norm is not None and float(r.grad_norm) > 0.05 for r in results), "clipping was active"


def test_grad_norm_is_the_unscaled_norm_before_clipping():
    x, y = make_data()
    reference = make_mlp(seed=2)
    loss_of(reference, x, y).backward()
    expected = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in reference.parameters()))
    model = make_mlp(seed=2)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**14)
    with scaler_machinery(model):
        scaler.scale(loss_of(model, x, y)).backward()
        result = scaler.step(opt, grad_clip=paddle.nn.ClipGradByGlobalNorm(1e-3))
    assert isinstance(result, StepResult) and result.loss_scale == 2.0**14 and not result.skipped
    assert isinstance(result.grad_norm, paddle.Tensor)
    np.testing.assert_allclose(float(result.grad_norm), expected, rtol=1e-5)


@pytest.mark.parametrize("clip", [paddle.nn.ClipGradByNorm(0.01), paddle.nn.ClipGradByValue(0.001)])
def test_per_tensor_clips_match_paddles_optimizer_clip(clip):
    x, y = make_data()
    control, scaled = make_mlp(seed=9), make_mlp(seed=9)
    opt_c = paddle.optimizer.SGD(learning_rate=0.5, parameters=control.parameters(), grad_clip=clip)
    opt_s = paddle.optimizer.SGD(learning_rate=0.5, parameters=scaled.parameters())
    loss_of(control, x, y).backward()
    opt_c.step()
    scaler = amp.GradScaler(init_loss_scaling=2.0**6)
    with scaler_machinery(scaled):
        scaler.scale(loss_of(scaled, x, y)).backward()
        scaler.step(opt_s, grad_clip=clip)
        scaler.update()
    for a, b in zip(params_of(scaled), params_of(control)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_disabled_scaler_still_clips_and_reports_the_norm():
    x, y = make_data()
    control, model = make_mlp(seed=4), make_mlp(seed=4)
    opt_c = paddle.optimizer.SGD(learning_rate=0.5, parameters=control.parameters(),
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(0.01))
    opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
    loss_of(control, x, y).backward()
    opt_c.step()
    scaler = amp.GradScaler(enable=False)
    scaler.scale(loss_of(model, x, y)).backward()
    result = scaler.step(opt, grad_clip=0.01)
    scaler.update()
    assert result.loss_scale == 1.0 and not result.skipped and float(result.grad_norm) > 0.01
    for a, b in zip(params_of(model), params_of(control)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def run_pattern(pattern, **kwargs):
    """Drive update() with a found_inf pattern; return the scale after each iteration."""
    model = make_mlp(seed=1)
    opt = paddle.optimizer.SGD(learning_rate=0.0, parameters=model.parameters())
    scaler = amp.GradScaler(**kwargs)
    x, y = make_data()
    scales = []
    with scaler_machinery(model):
        for poison in pattern:
            scaler.scale(loss_of(model, x, y, poison)).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            scales.append(scaler.loss_scale)
    return scales, scaler


def test_bounds_cap_growth_and_decrease():
    scales, _ = run_pattern([False] * 4, init_loss_scaling=8.0, incr_every_n_steps=1, max_loss_scaling=32.0)
    assert scales == [16.0, 32.0, 32.0, 32.0]
    scales, _ = run_pattern([True] * 4, init_loss_scaling=8.0, min_loss_scaling=2.0)
    assert scales == [4.0, 2.0, 2.0, 2.0]


def test_hysteresis_modes():
    pattern = [True, False, True, False, True]
    consecutive, _ = run_pattern(pattern, init_loss_scaling=64.0, decr_every_n_nan_or_inf=2)
    cumulative, _ = run_pattern(pattern, init_loss_scaling=64.0, decr_every_n_nan_or_inf=2, hysteresis="cumulative")
    assert consecutive == [64.0] * 5, "Paddle's rule: a finite step resets the inf count"
    assert cumulative == [64.0, 64.0, 32.0, 32.0, 32.0]


def test_collapse_raises_after_n_consecutive_skips():
    with pytest.raises(AmpOverflowError, match=r"3 consecutive steps had inf/nan.*whatever the scale.*find_overflow"):
        run_pattern([True] * 5, init_loss_scaling=8.0, max_consecutive_skips=3, on_collapse="raise")


def test_collapse_warns_once_and_minimum_is_reported(caplog_amp):
    scales, scaler = run_pattern([True] * 6, init_loss_scaling=4.0, max_consecutive_skips=3)
    collapse = [r for r in caplog_amp.records if "consecutive steps had inf/nan" in r.getMessage()]
    assert len(collapse) == 1 and collapse[0].levelno == logging.WARNING
    assert any("reached its minimum 1" in r.getMessage() for r in caplog_amp.records)
    assert scales[-1] == 1.0 and scaler.consecutive_skips == 6


def test_overflow_goes_to_logging_and_hooks_not_print(capsys, caplog_amp):
    events = []

    class Recorder:
        def on_step(self, event):
            events.append(("step", event.step, event.result.skipped))

        def on_overflow(self, event):
            events.append(("overflow", event.step, event.next_loss_scale))

    run_pattern([False, True], init_loss_scaling=16.0, hooks=[Recorder()])
    assert events == [("step", 0, False), ("overflow", 1, 8.0), ("step", 1, True)]
    assert "Found inf/nan in gradients at step 1" in caplog_amp.text
    assert "Found inf" not in capsys.readouterr().out


def test_survives_overflow_where_paddles_scaler_crashes_with_numpy_2_4():
    """Paddle 3.x's own _update does float() of a 1-element array: numpy >= 2.4 refuses."""
    scales, _ = run_pattern([True, False], init_loss_scaling=2.0**16)
    assert scales == [2.0**15, 2.0**15]
    numpy_24 = tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4)
    if not numpy_24 or paddle.__version__.startswith("2."):
        pytest.skip(f"Paddle's crash needs Paddle 3.x with numpy >= 2.4 (have {paddle.__version__}, {np.__version__})")
    from paddle_amp_ext import _compat

    theirs = paddle.amp.GradScaler(enable=False)
    _compat.init_scaler_state(theirs, 2.0**16)
    _compat.set_scaler_enabled(theirs, True)
    theirs._incr_ratio, theirs._decr_ratio = 2.0, 0.5
    theirs._incr_every_n_steps, theirs._decr_every_n_nan_or_inf = 2000, 1
    theirs._cache_found_inf = True
    with pytest.raises(TypeError, match="only 0-dimensional arrays"):
        theirs._update()


def test_several_optimizers_share_one_scaler():
    x, y = make_data()
    first, second = make_mlp(seed=1), make_mlp(seed=2)
    opt1 = paddle.optimizer.SGD(learning_rate=0.1, parameters=first.parameters())
    opt2 = paddle.optimizer.SGD(learning_rate=0.1, parameters=second.parameters())
    scaler = amp.GradScaler(init_loss_scaling=64.0)
    with scaler_machinery(paddle.nn.Sequential(first, second)):
        before1, before2 = params_of(first), params_of(second)
        loss = loss_of(first, x, y, poison=True) + loss_of(second, x, y)
        scaler.scale(loss).backward()
        r1, r2 = scaler.step(opt1), scaler.step(opt2)
        scaler.update()
    assert r1.skipped and not r2.skipped
    assert all(np.array_equal(a, b) for a, b in zip(before1, params_of(first)))
    assert not all(np.array_equal(a, b) for a, b in zip(before2, params_of(second)))
    assert scaler.loss_scale == 32.0 and scaler.last_step_skipped


def test_gradient_accumulation_equals_the_full_batch():
    x, y = make_data(n=32)
    full, accum = make_mlp(seed=6), make_mlp(seed=6)
    opt_f = paddle.optimizer.SGD(learning_rate=0.1, parameters=full.parameters())
    opt_a = paddle.optimizer.SGD(learning_rate=0.1, parameters=accum.parameters())
    loss_of(full, x, y).backward()
    opt_f.step()
    scaler = amp.GradScaler(init_loss_scaling=2.0**10)
    events = []
    scaler.add_hook(events.append)
    with scaler_machinery(accum):
        for part in range(4):
            xs, ys = x[part * 8:(part + 1) * 8], y[part * 8:(part + 1) * 8]
            scaler.scale(loss_of(accum, xs, ys) / 4).backward()
        scaler.step(opt_a)
        scaler.update()
    for a, b in zip(params_of(accum), params_of(full)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    full_loss = float(paddle.nn.functional.mse_loss(make_mlp(seed=6)(x), y))
    assert len(events) == 1 and abs(float(events[0].loss) - full_loss) < 1e-5


def test_state_dict_round_trip_mid_run_gives_the_identical_trajectory():
    pattern = [False, True, False, False, False, True, False, False, False, False]
    full, _ = run_pattern(pattern, init_loss_scaling=2.0**8, incr_every_n_steps=2)
    first, scaler = run_pattern(pattern[:5], init_loss_scaling=2.0**8, incr_every_n_steps=2)
    state = scaler.state_dict()
    assert state["version"] == 1 and state["incr_count"] == 1 and state["skipped_steps"] == 1
    resumed = amp.GradScaler()
    resumed.load_state_dict(state)
    model = make_mlp(seed=1)
    opt = paddle.optimizer.SGD(learning_rate=0.0, parameters=model.parameters())
    x, y = make_data()
    rest = []
    with scaler_machinery(model):
        for poison in pattern[5:]:
            resumed.scale(loss_of(model, x, y, poison)).backward()
            resumed.step(opt)
            resumed.update()
            opt.clear_grad()
            rest.append(resumed.loss_scale)
    assert first + rest == full
    assert resumed.skipped_steps == 2


def test_loads_a_state_dict_from_paddles_own_scaler():
    from paddle_amp_ext import _compat

    theirs = paddle.amp.GradScaler(enable=False, init_loss_scaling=2.0**13)
    _compat.init_scaler_state(theirs, 2.0**13)
    _compat.set_scaler_enabled(theirs, True)
    for name, value in dict(_incr_ratio=3.0, _decr_ratio=0.25, _incr_every_n_steps=7,
                            _decr_every_n_nan_or_inf=2, _incr_count=4, _decr_count=1).items():
        setattr(theirs, name, value)
    state = theirs.state_dict()
    assert "version" not in state and state["scale"].shape == (1,)
    ours = amp.GradScaler()
    ours.load_state_dict(state)
    assert ours.state_dict()["scale"][0] == 2.0**13 and ours.get_incr_ratio() == 3.0 and ours.get_decr_ratio() == 0.25
    assert ours.state_dict()["incr_count"] == 4 and ours.get_incr_every_n_steps() == 7
    with pytest.raises(RuntimeError, match="state dict is empty"):
        ours.load_state_dict({})
    with pytest.raises(ValueError, match="version 99 is newer"):
        ours.load_state_dict({**ours.state_dict(), "version": 99})


def test_step_scheduler_steps_only_when_the_optimizer_stepped():
    model = make_mlp(seed=1)
    scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1, gamma=0.5)
    opt = paddle.optimizer.SGD(learning_rate=scheduler, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=8.0)
    x, y = make_data()
    stepped = []
    with scaler_machinery(model):
        for poison in [False, True, False]:
            scaler.scale(loss_of(model, x, y, poison)).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            stepped.append(scaler.step_scheduler(scheduler))
    assert stepped == [True, False, True]
    assert scheduler.last_epoch == 2 and opt.get_lr() == pytest.approx(0.025)


def test_misuse_is_named():
    model = make_mlp(seed=1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=8.0)
    x, y = make_data()
    with scaler_machinery(model):
        scaler.scale(loss_of(model, x, y)).backward()
        scaler.step(opt)
        with pytest.raises(RuntimeError, match=r"step\(\) has already been called on this optimizer"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step\(\)"):
            scaler.unscale_(opt)
        scaler.update()
        scaler.scale(loss_of(model, x, y)).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
            scaler.unscale_(opt)
        with pytest.raises(TypeError, match=r"grad_clip must be a float max global norm"):
            scaler.step(opt, grad_clip="1.0")
        with pytest.raises(ValueError, match=r"grad_clip \(max global norm\) must be > 0"):
            scaler.step(opt, grad_clip=-1.0)
        result = scaler.step(opt, grad_clip=1.0)  # respects the earlier unscale_
        assert not result.skipped
    with pytest.raises(ValueError, match=r"min_loss_scaling must be > 0"):
        amp.GradScaler(min_loss_scaling=0.0)
    with pytest.raises(ValueError, match=r"max_loss_scaling must be > 0"):
        amp.GradScaler(max_loss_scaling=-1.0)
    with pytest.raises(TypeError, match=r"enable must be True, False or 'auto'"):
        amp.GradScaler(enable="yes")


def test_scaler_created_before_emulation_runs_inside_it():
    scaler = amp.GradScaler(init_loss_scaling=4.0)
    assert not scaler.is_enable()
    model = make_mlp(seed=1)
    x, y = make_data()
    loss = loss_of(model, x, y)
    assert scaler.scale(loss) is loss
    with scaler_machinery(model):
        scaled = scaler.scale(loss_of(model, x, y))
        assert scaler.is_enable()
        np.testing.assert_allclose(scaled.item(), 4.0 * loss.item(), rtol=1e-6)


def test_config_and_explicit_settings_do_not_mix():
    cfg = amp.AmpConfig(init_loss_scaling=8.0)
    assert amp.GradScaler(config=cfg).state_dict()["scale"][0] == 8.0
    with pytest.raises(TypeError, match=r"Pass either config= or \['incr_ratio'\]"):
        amp.GradScaler(config=cfg, incr_ratio=4.0)
    with pytest.raises(TypeError, match="config must be an AmpConfig"):
        amp.GradScaler(config={"init_loss_scaling": 8.0})


def test_auto_scaler_is_off_on_cpu_and_on_inside_fp16_emulation():
    scaler = amp.GradScaler(enable="auto", init_loss_scaling=16.0)
    model = make_mlp(seed=1)
    x, y = make_data()
    loss = loss_of(model, x, y)
    assert scaler.scale(loss) is loss and not scaler.is_enable()
    with scaler_machinery(model):
        scaled = scaler.scale(loss_of(model, x, y))
        assert scaler.is_enable()
        np.testing.assert_allclose(scaled.item(), 16.0 * loss.item(), rtol=1e-6)
