"""The gradients a step applies (paddle_amp_ext.gradients), as a hostile user sets them up.

Frozen layers with stale gradients, a ``main_grad`` the optimizer does or does not read, a
``main_grad`` of the wrong shape, dtype or type, and ``optimizer.minimize`` on a guarded
optimizer. Real Paddle optimizers on the CPU, both Paddle versions.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, params_of
from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionLayer, MixPrecisionOptimizer

import paddle_amp_ext as amp
from paddle_amp_ext import _compat
from paddle_amp_ext._compat import optimizer as compat_opt
from paddle_amp_ext.gradients import applied_grads, checked_main_grad

PADDLE3 = _compat.PADDLE_VERSION >= (3, 0, 0)


def loss_of(model, x, y):
    return paddle.nn.functional.mse_loss(model(x), y)


def freeze(layer, how: str) -> None:
    for param in layer.parameters():
        if how == "stop_gradient":
            param.stop_gradient = True
        else:
            param.trainable = False


def poison_grads(layer, value=float("nan")) -> None:
    for param in layer.parameters():
        param._grad_ivar().set_value(paddle.full(param.shape, value, dtype=param.dtype))


# ---------------------------------------------------------------------- frozen layers
@pytest.mark.parametrize("how", ["stop_gradient", "trainable"])
def test_a_frozen_layer_with_a_stale_nan_gradient_does_not_make_the_guard_skip_later_steps(how):
    x, y = make_data()
    model = make_mlp(seed=2)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    guard = amp.guard_optimizer(opt)
    loss_of(model, x, y).backward()
    poison_grads(model[0])                       # the overflow step's gradient of the first layer
    opt.step()
    assert guard.last_step_skipped               # the NaN step is skipped, as it must be
    freeze(model[0], how)                        # then the user freezes that layer
    opt.clear_grad()                             # Paddle's clear_grad leaves a frozen gradient alone
    assert np.isnan(model[0].weight.grad.numpy()).all(), "premise: the stale NaN gradient stays"
    frozen = params_of(model[0])
    for _ in range(3):
        before = params_of(model)
        loss_of(model, x, y).backward()
        opt.step()
        opt.clear_grad()
        assert not guard.last_step_skipped
        assert any(not np.array_equal(a, b) for a, b in zip(before[2:], params_of(model)[2:]))
    for a, b in zip(frozen, params_of(model[0])):
        np.testing.assert_array_equal(a, b)
    assert guard.skipped_steps == 1
    guard.remove()


@pytest.mark.parametrize("how", ["stop_gradient", "trainable"])
def test_a_frozen_layers_stale_gradient_is_not_in_the_clip_norm(how):
    """Paddle's own clip (in the optimizer) leaves it out; step(grad_clip=) must too (else over-clip)."""
    x, y = make_data()
    runs = []
    for ours in (True, False):
        model = make_mlp(seed=5)
        clip = None if ours else paddle.nn.ClipGradByGlobalNorm(0.05)
        opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters(), grad_clip=clip)
        loss_of(model, x, y).backward()
        poison_grads(model[0], 3.0)                # a large, finite, stale gradient
        freeze(model[0], how)
        expected = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum())
                               for p in model.parameters() if not p.stop_gradient))
        if ours:
            scaler = amp.GradScaler(enable=False)
            result = scaler.step(opt, grad_clip=0.05)
            scaler.update()
            np.testing.assert_allclose(float(result.grad_norm), expected, rtol=1e-6)
        else:
            opt.step()
        runs.append(params_of(model))
    assert expected > 0.05, "the clip was active"
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_frozen_layers_stale_nan_gradient_does_not_skip_a_loss_scaled_step():
    """With loss scaling (inside the rehearsal) the scaler's unscale judges the same gradients."""
    x, y = make_data()
    model = make_mlp(seed=3)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**4)
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        scaler.scale(loss_of(model, x, y)).backward()
        poison_grads(model[0], float("inf"))
        freeze(model[0], "trainable")
        stale = model[0].weight.grad.numpy().copy()
        result = scaler.step(opt)
        scaler.update()
    assert not result.skipped and scaler.loss_scale == 2.0**4
    np.testing.assert_array_equal(model[0].weight.grad.numpy(), stale)  # not unscaled: not applied


# ---------------------------------------------------------------------- main_grad read or not
def test_which_gradient_each_optimizer_applies():
    model = make_mlp(seed=0)
    sgd = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    groups = paddle.optimizer.SGD(learning_rate=0.1, parameters=[{"params": model.parameters()}])
    mix = MixPrecisionOptimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()))
    rule = compat_opt.main_grad_rule
    assert rule(sgd) == (compat_opt.MAIN_GRAD_FIRST if PADDLE3 else compat_opt.MAIN_GRAD_NEVER)
    assert rule(groups) == compat_opt.MAIN_GRAD_NEVER
    assert rule(mix) == compat_opt.MAIN_GRAD_ONLY
    assert rule(sgd, via="minimize") == rule(mix, via="minimize") == compat_opt.MAIN_GRAD_NEVER
    assert rule(object()) == compat_opt.MAIN_GRAD_FIRST


def set_main_grads(model, value: float) -> None:
    for param in model.parameters():
        param.main_grad = paddle.full(param.shape, value, dtype="float32")


def test_a_nan_grad_beside_a_finite_main_grad_is_judged_as_the_optimizer_applies_it():
    """2.6.2's step applies .grad (NaN: skipped); 3.3.1's applies main_grad (finite: applied)."""
    x, y = make_data()
    model = make_mlp(seed=4)
    opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
    guard = amp.guard_optimizer(opt)
    loss_of(model, x, y).backward()
    poison_grads(model)
    set_main_grads(model, 0.25)
    before = params_of(model)
    opt.step()
    if PADDLE3:
        assert not guard.last_step_skipped
        for a, b in zip(before, params_of(model)):
            np.testing.assert_allclose(b, a - np.float32(0.5 * 0.25), rtol=0, atol=1e-7)
    else:
        assert guard.last_step_skipped
        for a, b in zip(before, params_of(model)):
            np.testing.assert_array_equal(a, b)
    guard.remove()


def test_a_param_group_optimizer_applies_grad_so_a_nan_grad_skips_despite_main_grad():
    x, y = make_data()
    model = make_mlp(seed=4)
    opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=[{"params": model.parameters()}])
    with amp.guard_optimizer(opt) as guard:
        loss_of(model, x, y).backward()
        poison_grads(model[2])
        set_main_grads(model, 0.25)
        before = params_of(model)
        opt.step()
        assert guard.last_step_skipped
    for a, b in zip(before, params_of(model)):
        np.testing.assert_array_equal(a, b)


def test_applied_grads_pairs_are_the_tensors_the_update_reads():
    model = make_mlp(seed=0)
    x, y = make_data()
    loss_of(model, x, y).backward()
    model[0].weight.stop_gradient = True
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    pairs = applied_grads(opt)
    assert [p.name for p, _ in pairs] == [p.name for p in model.parameters()][1:]
    assert applied_grads(opt, []) == []
    assert [p.name for p, _ in applied_grads(opt, [model[2].bias])] == [model[2].bias.name]


# ---------------------------------------------------------------------- main_grad validation
def mix_model(seed: int = 0):
    inner = make_mlp(seed=seed)
    model = MixPrecisionLayer(inner, dtype="float16")
    opt = MixPrecisionOptimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=inner.parameters()))
    return model, inner, opt


BAD_MAIN_GRADS = [
    ("shape", lambda p: paddle.zeros([3], dtype="float32"), ValueError,
     r"Parameter '.+' of shape \[8, 16\] has a main_grad of shape \[3\]; the optimizer would apply it element "
     r"by element to the parameter: set it to a float32 paddle.Tensor of shape \[8, 16\]"),
    ("int64", lambda p: paddle.zeros(p.shape, dtype="int64"), TypeError,
     r"Parameter '.+' has a main_grad of dtype paddle.int64; a master gradient is a float tensor: set it to a "
     r"float32 paddle.Tensor of shape \[8, 16\] .*\(e.g. main_grad.astype\('float32'\)\)"),
    ("numpy", lambda p: np.zeros(p.shape, dtype="float32"), TypeError,
     r"Parameter '.+' has main_grad=<ndarray of shape \[8, 16\], dtype float32> \(of type ndarray\), which the optimizer reads as its float32 "
     r"master gradient: set it to a float32 paddle.Tensor of shape \[8, 16\]"),
    ("float", lambda p: 0.0, TypeError, r"has main_grad=0.0 \(of type float\)"),
]


@pytest.mark.parametrize("case, make, error, message", BAD_MAIN_GRADS, ids=[c[0] for c in BAD_MAIN_GRADS])
@pytest.mark.parametrize("path", ["guard", "scaler-off", "scaler-on", "clip"])
def test_a_bad_main_grad_is_a_clear_error_naming_the_parameter(case, make, error, message, path):
    x, y = make_data()
    model, inner, opt = mix_model()
    loss_of(model, x, y).backward()
    first = inner[0].weight
    first.main_grad = make(first)
    before = params_of(inner)
    with pytest.raises(error, match=message) as info:
        if path == "guard":
            with amp.guard_optimizer(opt):
                opt.step()
        elif path == "clip":
            amp.GradScaler(enable=False).step(opt, grad_clip=1.0)
        elif path == "scaler-off":
            amp.GradScaler(enable=False).step(opt)
        else:
            with amp.fp16_emulation(model):
                amp.GradScaler().unscale_(opt)
    assert first.name in str(info.value)
    for a, b in zip(before, params_of(inner)):
        np.testing.assert_array_equal(a, b)  # nothing applied


@pytest.mark.skipif(not PADDLE3, reason="Paddle 2.6.2's Optimizer.step never reads main_grad")
def test_a_short_main_grad_on_a_plain_optimizer_is_refused_before_paddle_reads_past_it():
    x, y = make_data()
    model = make_mlp(seed=0)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    loss_of(model, x, y).backward()
    model[2].bias.main_grad = paddle.zeros([], dtype="float32")
    with amp.guard_optimizer(opt), pytest.raises(ValueError, match=r"of shape \[16\] has a main_grad of shape \[\]"):
        opt.step()


def test_a_main_grad_the_optimizer_does_not_read_is_not_checked():
    """A frozen parameter's, or any on a ``minimize`` (which applies .grad)."""
    model = make_mlp(seed=0)
    x, y = make_data()
    loss_of(model, x, y).backward()
    model[0].weight.stop_gradient = True
    model[0].weight.main_grad = "stale"
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    assert model[0].weight.name not in [p.name for p, _ in applied_grads(opt)]
    model[2].bias.main_grad = "stale"
    assert len(applied_grads(opt, via="minimize")) == len(model.parameters()) - 1
    assert checked_main_grad(model[4].bias) is None


# ---------------------------------------------------------------------- minimize on a guarded optimizer
def test_minimize_on_a_guarded_optimizer_is_guarded():
    x, y = make_data()
    model, control = make_mlp(seed=6), make_mlp(seed=6)
    opt = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    opt_c = paddle.optimizer.Adam(learning_rate=0.01, parameters=control.parameters())
    events = []
    guard = amp.guard_optimizer(opt, hooks=[events.append])
    for poison in (False, True, False):
        before = params_of(model)
        loss = loss_of(model, x, y)
        (loss * float("nan") if poison else loss).backward()
        returned = opt.minimize(loss)
        opt.clear_grad()
        if poison:
            assert returned == (None, None)
            for a, b in zip(before, params_of(model)):
                np.testing.assert_array_equal(a, b)
        else:
            ops, params_grads = returned
            assert len(params_grads) == len(model.parameters())
            loss_c = loss_of(control, x, y)
            loss_c.backward()
            opt_c.minimize(loss_c)
            opt_c.clear_grad()
        for a, b in zip(params_of(model), params_of(control)):
            np.testing.assert_array_equal(a, b)
    assert [e.result.skipped for e in events] == [False, True, False]
    assert guard.skipped_steps == 1
    guard.remove()
    assert "minimize" not in vars(opt) and "step" not in vars(opt)


def test_a_guarded_minimize_judges_the_parameters_it_applies():
    x, y = make_data()
    model = make_mlp(seed=7)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    with amp.guard_optimizer(opt) as guard:
        loss = loss_of(model, x, y)
        loss.backward()
        poison_grads(model[0])
        last = list(model[4].parameters())
        before = params_of(model)
        opt.minimize(loss, parameters=last)           # applies only the last layer: finite
        assert not guard.last_step_skipped
        after = params_of(model)
        for a, b in zip(before[:-2], after[:-2]):
            np.testing.assert_array_equal(a, b)
        assert all(not np.array_equal(a, b) for a, b in zip(before[-2:], after[-2:]))
        opt.minimize(loss, None, model[0].parameters())  # positional: the NaN layer
        assert guard.last_step_skipped and guard.skipped_steps == 1
        for a, b in zip(after, params_of(model)):
            np.testing.assert_array_equal(a, b)


def test_a_guarded_minimize_that_raises_leaves_the_guard_usable():
    model = make_mlp(seed=0)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    x, y = make_data()
    with amp.guard_optimizer(opt) as guard:
        loss = loss_of(model, x, y)
        loss.backward()
        with pytest.raises(TypeError):
            opt.minimize(loss, None, 5)                # not an iterable of parameters
        opt.minimize(loss)
        assert guard.skipped_steps == 0 and guard.last_result is not None


def test_the_advisors_gradient_range_reads_the_applied_gradients():
    """A frozen layer's stale gradient does not set the proposed loss scale; a master gradient does."""
    from paddle_amp_ext.rehearsal.advisor import _grad_range

    model = make_mlp(seed=0)
    x, y = make_data()
    loss_of(model, x, y).backward()
    trainable_high = max(float(np.abs(p.grad.numpy()).max()) for p in model.parameters()[2:])
    poison_grads(model[0], 1e6)
    assert _grad_range(model)[1] == 1e6
    freeze(model[0], "trainable")
    assert _grad_range(model)[1] == np.float32(trainable_high) < 1e6
    model[4].bias.main_grad = paddle.full([1], 5e5, dtype="float32")
    assert _grad_range(model)[1] == 5e5


def test_step_with_chosen_parameters_judges_every_applied_gradient_and_reports_the_clips_norm():
    """A NaN outside ``parameters`` still skips (the optimizer applies it); the norm is the clip's."""
    x, y = make_data()
    model = make_mlp(seed=8)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = amp.GradScaler(enable=False)
    loss_of(model, x, y).backward()
    chosen = list(model[4].parameters())
    expected = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in chosen))
    result = scaler.step(opt, parameters=chosen, grad_clip=1e6)
    scaler.update()
    assert not result.skipped
    np.testing.assert_allclose(float(result.grad_norm), expected, rtol=1e-6)
    opt.clear_grad()
    loss_of(model, x, y).backward()
    poison_grads(model[0])
    before = params_of(model)
    result = scaler.step(opt, parameters=chosen, grad_clip=1e6)
    scaler.update()
    assert result.skipped
    for a, b in zip(before, params_of(model)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("thing", [None, 3, "sgd", object()], ids=repr)
def test_guard_of_anything_unguarded_is_none(thing):
    from paddle_amp_ext.guard import guard_of

    assert guard_of(thing) is None


def test_guard_of_names_the_active_guard_only():
    from paddle_amp_ext.guard import guard_of

    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=make_mlp(seed=0).parameters())
    assert guard_of(opt) is None
    guard = amp.guard_optimizer(opt)
    assert guard_of(opt) is guard
    guard.remove()
    assert guard_of(opt) is None
