"""No silent NaNs and no trusted garbage: the non-finite guard and the one validator of scaler settings."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, params_of

import paddle_amp_ext as amp
from paddle_amp_ext import AmpOverflowError


def nan_loss(model, x, y, poison):
    loss = paddle.nn.functional.mse_loss(model(x), y)
    return loss * float("nan") if poison else loss


@pytest.mark.parametrize("clip", [None, 1.0])
def test_nan_gradients_never_reach_the_weights_with_loss_scaling_off(clip):
    """A CPU outside rehearsal (loss scaling off): Paddle's scaler steps on NaN gradients."""
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = amp.GradScaler(max_consecutive_skips=3)
    assert not scaler.is_enable()
    results = []
    for poison in (False, True, True, False):
        before = params_of(model)
        scaler.scale(nan_loss(model, x, y, poison)).backward()
        results.append(scaler.step(opt, grad_clip=clip))
        scaler.update()
        opt.clear_grad()
        if poison:
            for a, b in zip(before, params_of(model)):
                np.testing.assert_array_equal(a, b)
    assert [r.skipped for r in results] == [False, True, True, False]
    assert all(np.isfinite(p).all() for p in params_of(model))
    assert scaler.skipped_steps == 2 and scaler.consecutive_skips == 0
    assert [r.loss_scale for r in results] == [1.0] * 4


def test_paddles_own_scaler_applies_nan_gradients_there():
    """The control: what the guard prevents really happens with paddle.amp on a CPU."""
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = paddle.amp.GradScaler()
    scaler.scale(nan_loss(model, x, y, True)).backward()
    scaler.step(opt)
    assert not all(np.isfinite(p).all() for p in params_of(model))


def test_nonfinite_steps_count_toward_collapse_and_reach_hooks():
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    overflows = []

    class Hook:
        def on_step(self, event):
            pass

        def on_overflow(self, event):
            overflows.append(event.step)

    scaler = amp.GradScaler(enable=False, max_consecutive_skips=2, on_collapse="raise", hooks=[Hook()])
    scaler.scale(nan_loss(model, x, y, True)).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    scaler.scale(nan_loss(model, x, y, True)).backward()
    scaler.step(opt)
    with pytest.raises(AmpOverflowError, match=r"2 consecutive steps had inf/nan gradients \(loss scaling off\)"):
        scaler.update()
    assert overflows == [0, 1]


def test_guard_can_be_turned_off_and_bf16_emulation_is_guarded_too():
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    unguarded = amp.GradScaler(skip_nonfinite=False)
    unguarded.scale(nan_loss(model, x, y, True)).backward()
    assert unguarded.step(opt).skipped is False
    assert not all(np.isfinite(p).all() for p in params_of(model))

    model = make_mlp()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = amp.GradScaler()
    with amp.fp16_emulation(model, dtype="bfloat16"):  # bf16: loss scaling off, guard on
        scaler.scale(nan_loss(model, x, y, True)).backward()
        assert scaler.step(opt).skipped and not scaler.is_enable()
    with pytest.raises(TypeError, match="skip_nonfinite must be True or False"):
        amp.GradScaler(skip_nonfinite="yes")


def test_step_twice_is_an_error_also_with_loss_scaling_off():
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = amp.GradScaler(enable=False)
    scaler.scale(nan_loss(model, x, y, False)).backward()
    scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called on this optimizer"):
        scaler.step(opt)
    scaler.update()
    scaler.step(opt)  # a new iteration


# --------------------------------------------------------------------------- one validator
GOOD = amp.GradScaler(init_loss_scaling=1024.0).state_dict()


@pytest.mark.parametrize("key,value,error,match", [
    ("scale", 0.0, ValueError, r"init_loss_scaling must be > 0"),
    ("scale", np.array([np.nan], dtype=np.float32), ValueError, r"must be finite"),
    ("scale", -5.0, ValueError, r"init_loss_scaling must be > 0"),
    ("scale", "big", TypeError, r"'scale' must be a number"),
    ("decr_ratio", 2.0, ValueError, r"decr_ratio must be in \(0, 1\)"),
    ("incr_every_n_steps", 0, ValueError, r"incr_every_n_steps must be >= 1"),
    ("hysteresis", "bogus", ValueError, r"'hysteresis' must be one of"),
    ("use_dynamic_loss_scaling", "False", TypeError, r"'use_dynamic_loss_scaling' must be True or False"),
    ("min_loss_scaling", 4096.0, ValueError, r"init_loss_scaling=1024.0 is below min_loss_scaling=4096.0"),
    ("incr_count", -1, ValueError, r"'incr_count': must be an int >= 0"),
])
def test_load_state_dict_rejects_bad_values_and_changes_nothing(key, value, error, match):
    scaler = amp.GradScaler(init_loss_scaling=256.0)
    before = scaler.state_dict()
    bad = dict(GOOD, **{key: value})
    with pytest.raises(error, match=match):
        scaler.load_state_dict(bad)
    after = scaler.state_dict()
    assert {k: np.asarray(v).tolist() for k, v in after.items()} == {k: np.asarray(v).tolist() for k, v in before.items()}


def test_load_state_dict_names_missing_keys_and_wrong_types():
    scaler = amp.GradScaler()
    with pytest.raises(ValueError, match=r"missing \['decr_ratio'\]"):
        scaler.load_state_dict({k: v for k, v in GOOD.items() if k != "decr_ratio"})
    with pytest.raises(TypeError, match=r"expects the dict from GradScaler.state_dict\(\). Received: 'scale'"):
        scaler.load_state_dict("scale")
    with pytest.raises(TypeError, match=r"Received: None \(of type NoneType\)"):
        scaler.load_state_dict(None)
    with pytest.raises(RuntimeError, match="saved from a disabled"):
        scaler.load_state_dict({})


def test_the_scale_always_lies_within_its_bounds():
    with pytest.raises(ValueError, match=r"init_loss_scaling=1073741824.0 is above max_loss_scaling=16777216.0"):
        amp.GradScaler(init_loss_scaling=2.0**30, max_loss_scaling=2.0**24)
    with pytest.raises(ValueError, match=r"init_loss_scaling=0.5 is below min_loss_scaling=1.0"):
        amp.GradScaler(init_loss_scaling=0.5)
    assert amp.GradScaler(init_loss_scaling=0.5, min_loss_scaling=0.25).state_dict()["scale"][0] == 0.5
    scaler = amp.GradScaler(max_loss_scaling=2.0**20)
    with pytest.raises(ValueError, match=r"is above max_loss_scaling"):
        scaler.set_init_loss_scaling(2.0**40)
    with pytest.raises(ValueError, match=r"is above max_loss_scaling"):
        amp.AmpConfig(init_loss_scaling=2.0**30, max_loss_scaling=2.0**24)
    assert amp.GradScaler(init_loss_scaling=2.0**32).state_dict()["scale"][0] == 2.0**32, \
        "without an explicit bound, any float32 scale is accepted (as in Paddle)"


def test_numpy_scalars_are_numbers_everywhere():
    scaler = amp.GradScaler(init_loss_scaling=np.float32(1024), incr_every_n_steps=np.int64(10))
    assert scaler.state_dict()["scale"][0] == 1024.0 and scaler._incr_every_n_steps == 10
    cfg = amp.AmpConfig(init_loss_scaling=np.float64(512.0))
    assert type(cfg.init_loss_scaling) is float and cfg.to_json()
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler.scale(nan_loss(model, x, y, False)).backward()
    assert scaler.step(opt, grad_clip=np.float32(1.0)).grad_norm is not None
    with pytest.raises(TypeError, match="init_loss_scaling must be a number"):
        amp.GradScaler(init_loss_scaling=np.bool_(True))


def test_unhelpful_inputs_get_named_errors():
    with pytest.raises(TypeError, match=r"hooks must be a list of hooks"):
        amp.GradScaler(hooks="runs")
    assert amp.GradScaler(hooks=None).hooks == ()
    model, (x, y) = make_mlp(), make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = amp.GradScaler()
    scaler.scale(nan_loss(model, x, y, False)).backward()
    with pytest.raises(TypeError, match=r"pass parameters=model.parameters\(\)"):
        scaler.step(opt, parameters=model)
    with pytest.raises(TypeError, match=r"fp32 layer names must be str"):
        amp.keep_fp32(model, [1])
