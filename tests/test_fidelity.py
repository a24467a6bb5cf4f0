"""paddle.amp routed to paddle_amp_ext: the whole surface, static graphs, to_static, Paddle's scaler contract.

Where an expectation comes from Paddle's own ``test/amp`` suite, the test runs it against both
``paddle.amp`` and ``paddle_amp_ext`` and asserts the same outcome, plus what must hold for ours.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, params_of

import paddle_amp_ext as amp
from paddle_amp_ext import _compat
from paddle_amp_ext.backends import Accelerator
from paddle_amp_ext.gate import decide_by_support

P3 = _compat.PADDLE_VERSION >= (3, 0, 0)


def autocast_on() -> bool:
    check = getattr(paddle.amp, "is_autocast_enabled", None)
    return bool(check()) if check is not None else _compat.autocast_enabled()


def outcome(fn):
    """('ok', value) or ('raises', exception type): what a call does, to compare two modules."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the type is the outcome
        return "raises", type(exc)


# --------------------------------------------------------------------------- the surface
def test_every_name_in_paddle_amp_all_is_importable_from_the_package():
    missing = [name for name in paddle.amp.__all__ if not hasattr(amp, name)]
    assert missing == []
    assert set(paddle.amp.__all__) <= set(amp.__all__)
    for name in ("amp_guard", "amp_decorate", "AmpScaler", "debugging"):
        assert name in amp.__all__ and hasattr(amp, name)


def test_the_package_can_stand_in_for_the_paddle_amp_module():
    """Code that does `paddle.amp = paddle_amp_ext` (or imports it as its amp) finds every attribute."""
    public = [name for name in dir(paddle.amp) if not name.startswith("_")]
    assert [name for name in public if not hasattr(amp, name)] == []
    assert amp.white_list is paddle.amp.white_list and amp.black_list()["float16"]["O1"]
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        amp.no_such_name  # noqa: B018


def test_debugging_reexports_paddles_tools():
    import paddle_amp_ext.debugging as ours

    for name in paddle.amp.debugging.__all__:
        assert getattr(ours, name) is getattr(paddle.amp.debugging, name)
    assert amp.debugging.TensorCheckerConfig is paddle.amp.debugging.TensorCheckerConfig


def test_legacy_names_are_the_validated_versions_with_paddles_defaults():
    assert amp.amp_guard is amp.auto_cast and amp.amp_decorate is amp.decorate
    scaler = amp.AmpScaler()
    assert isinstance(scaler, paddle.amp.AmpScaler) and isinstance(scaler, amp.GradScaler)
    assert scaler.state_dict()["scale"][0] == 2.0**15 and scaler._incr_every_n_steps == 1000
    with pytest.raises(ValueError, match="Unknown op 'softmx'"):
        amp.amp_guard(custom_black_list=["softmx"])


@pytest.mark.skipif(not P3, reason="is_autocast_enabled / get_autocast_dtype are Paddle 3.x names")
def test_autocast_queries_see_our_contexts_in_a_static_program():
    paddle.enable_static()
    try:
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            assert amp.is_autocast_enabled() is False
            with amp.auto_cast(True, dtype="bfloat16"):
                assert amp.is_autocast_enabled() is True and amp.get_autocast_dtype() == "bfloat16"
                with amp.auto_cast(False):
                    assert amp.is_autocast_enabled() is False
                assert amp.is_autocast_enabled() is True
            assert amp.is_autocast_enabled() is False
    finally:
        paddle.disable_static()


# --------------------------------------------------------------------------- static graph
def static_autocast(module, dtype="bfloat16", **kwargs):
    paddle.enable_static()
    try:
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            x = paddle.static.data("x", [4, 8], "float32")
            with module.auto_cast(dtype=dtype, **kwargs):
                paddle.nn.Linear(8, 4)(x)
                return autocast_on()
    finally:
        paddle.disable_static()


def test_static_auto_cast_enables_exactly_where_paddle_does():
    ours, theirs = outcome(lambda: static_autocast(amp)), outcome(lambda: static_autocast(paddle.amp))
    assert ours == theirs
    if P3:
        assert ours == ("ok", True), "Paddle 3.x enables AMP in a PIR program, with no device check"
    else:
        assert ours == ("raises", AssertionError), "Paddle 2.6 rejects auto_cast in a static graph"


def test_static_auto_cast_still_validates_the_lists():
    with pytest.raises(ValueError, match="Did you mean 'softmax'"):
        static_autocast(amp, custom_black_list=["softmx"])


def test_static_decorate_behaves_as_paddles():
    def run(module, level):
        paddle.enable_static()
        try:
            with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
                model = paddle.nn.Linear(4, 4)
                return module.decorate(model, level=level) is model
        finally:
            paddle.disable_static()

    for level in ("O1", "O2"):
        assert outcome(lambda lv=level: run(amp, lv)) == outcome(lambda lv=level: run(paddle.amp, lv))
    if P3:
        assert outcome(lambda: run(amp, "O1")) == ("ok", True)


@pytest.mark.skipif(not P3, reason="Paddle 2.6 has no static-graph GradScaler.scale for a loss")
def test_static_scaler_scales_and_minimizes_like_paddles():
    def train(module):
        paddle.enable_static()
        paddle.seed(0)
        np.random.seed(0)
        try:
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup):
                x = paddle.static.data("x", [4, 8], "float32")
                loss = paddle.mean(paddle.nn.Linear(8, 1)(x) ** 2)
                opt = paddle.static.amp.decorate(paddle.optimizer.SGD(learning_rate=0.1))
                scaler = module.GradScaler(init_loss_scaling=1024.0)
                scaled = scaler.scale(loss)
                assert _compat.is_static_value(scaled)
                scaler.minimize(opt, scaled)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            data = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
            return [float(np.asarray(exe.run(main, feed={"x": data}, fetch_list=[loss])[0])) for _ in range(3)]
        finally:
            paddle.disable_static()

    ours, theirs = train(amp), train(paddle.amp)
    assert ours == theirs and ours[2] < ours[0], "the program trains, step for step as Paddle's"


_IN_GRAPH: dict = {}


def _scaled_mean(x):
    return _IN_GRAPH["scaler"].scale(x.mean())


def test_scale_accepts_a_static_value_inside_to_static():
    def run(module):
        _IN_GRAPH["scaler"] = module.GradScaler(init_loss_scaling=1024.0)
        return float(paddle.jit.to_static(_scaled_mean, full_graph=True)(paddle.ones([2, 2])))

    ours, theirs = outcome(lambda: run(amp)), outcome(lambda: run(paddle.amp))
    assert ours == theirs
    if P3:  # 2.6's own scaler rejects a static Variable (TypeError), and so does ours there
        assert ours == ("ok", 1.0), "loss scaling is off on a CPU, for both scalers"


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("full_graph", [True, False])
def test_to_static_model_trains_with_our_scaler_and_clip(kept, full_graph):
    """A to_static model under amp.auto_cast, our scaler running for real (fp16 emulation, nothing
    rounded), step(grad_clip): the same parameters as the dygraph model, step for step."""
    x, y = make_data()

    def run(convert):
        model = make_mlp(seed=9)
        if kept:
            amp.keep_fp32(model, ["4"])
        net = paddle.jit.to_static(model, full_graph=full_graph) if convert else model
        opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
        scaler = amp.GradScaler(init_loss_scaling=2.0**10)
        results = []
        with amp.fp16_emulation(model, custom_black_list=["matmul"]):
            for _ in range(3):
                with amp.auto_cast():
                    loss = paddle.nn.functional.mse_loss(net(x), y)
                scaler.scale(loss).backward()
                results.append(scaler.step(opt, grad_clip=0.1))
                scaler.update()
                opt.clear_grad()
        return params_of(model), results

    (static_params, results), (dynamic_params, _) = run(True), run(False)
    assert all(r.loss_scale == 2.0**10 and not r.skipped for r in results), "the scaler ran for real"
    for a, b in zip(static_params, dynamic_params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not np.array_equal(static_params[0], params_of(make_mlp(seed=9))[0])


# --------------------------------------------------------------------------- Paddle's scaler contract
def test_paddles_bf16_expectation_scaler_turns_itself_off():
    """Paddle's TestGradScaler: after auto_cast(bfloat16) + scale, _enable and
    _use_dynamic_loss_scaling are False (bfloat16 needs no loss scaling)."""
    model = paddle.nn.Conv2D(3, 2, 3)

    def run(module):
        scaler = module.GradScaler()
        with module.auto_cast(custom_black_list=["conv2d"], dtype="bfloat16"):
            loss = model(paddle.rand([1, 3, 8, 8])).mean()
        scaler.scale(loss)
        return scaler._enable, scaler._use_dynamic_loss_scaling

    theirs = outcome(lambda: run(paddle.amp))  # Paddle 2.6's disabled scaler lacks the attribute
    assert outcome(lambda: run(amp)) == ("ok", (False, False))
    assert theirs in (("ok", (False, False)), ("raises", AttributeError))
    scaler = amp.GradScaler()
    with amp.fp16_emulation(model, dtype="bfloat16"):  # ours also where bf16 is rehearsed
        scaler.scale(model(paddle.rand([1, 3, 8, 8])).mean())
        assert scaler._enable is False and scaler.is_use_dynamic_loss_scaling() is False


def test_init_loss_scaling_and_dynamic_flag_follow_paddle():
    model = make_mlp()
    scaler = amp.GradScaler(init_loss_scaling=256.0, incr_every_n_steps=1)
    # a CPU outside emulation: loss scaling is off, as Paddle's scaler is there
    assert scaler.get_init_loss_scaling() == 1.0 and scaler.is_use_dynamic_loss_scaling() is False
    x, y = make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        for _ in range(3):
            scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
        assert scaler.loss_scale == 2048.0, "the scale grew every step"
        assert scaler.get_init_loss_scaling() == 256.0, "Paddle keeps the initial value"
        assert scaler.is_use_dynamic_loss_scaling() is True
        scaler.set_init_loss_scaling(64.0)
        assert scaler.get_init_loss_scaling() == 64.0 and scaler._scale.numpy()[0] == 64.0
    static = amp.GradScaler(use_dynamic_loss_scaling=False)
    with amp.fp16_emulation(model):
        static.scale(paddle.ones([1]))
        assert static.is_enable() and static.is_use_dynamic_loss_scaling() is False


@pytest.mark.parametrize("use_minimize", [False, True])
def test_cached_found_inf_is_set_after_every_step_as_paddle_sets_it(use_minimize):
    """PaddleNLP's Trainer reads _cache_found_inf (3.x) / _cache_founf_inf (2.6) right after
    step() to learn whether the optimizer ran."""
    model = make_mlp()
    x, y = make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    seen = []
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        for poison in (False, True, False):
            loss = paddle.nn.functional.mse_loss(model(x), y) * (float("inf") if poison else 1.0)
            scaled = scaler.scale(loss)
            scaled.backward()
            if use_minimize:
                scaler.minimize(opt, scaled)
            else:
                scaler.step(opt)
            seen.append((scaler._cache_found_inf, scaler._cache_founf_inf, bool(scaler._found_inf.numpy().any())))
            if not use_minimize:
                scaler.update()
            opt.clear_grad()
    assert seen == [(False, False, False), (True, True, True), (False, False, False)]


def test_disabled_scaler_still_reports_the_flag():
    model = make_mlp()
    x, y = make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scaler = amp.GradScaler(enable=False)
    assert scaler._cache_found_inf is None
    scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
    scaler.step(opt)
    assert scaler._cache_found_inf is False and scaler._cache_founf_inf is False


def test_state_dicts_load_in_both_directions():
    model = make_mlp()
    x, y = make_data()
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    ours = amp.GradScaler(init_loss_scaling=512.0, incr_every_n_steps=1)
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        scaler = ours
        scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
    theirs = paddle.amp.GradScaler(enable=False)
    _compat.init_scaler_state(theirs, 1.0)
    _compat.set_scaler_enabled(theirs, True)  # Paddle's scaler loads nothing while disabled
    theirs.load_state_dict(ours.state_dict())
    assert theirs._scale.numpy()[0] == 1024.0 and theirs.get_init_loss_scaling() == 1024.0
    assert theirs._incr_every_n_steps == 1 and theirs._use_dynamic_loss_scaling is True
    back = amp.GradScaler()
    back.load_state_dict(theirs.state_dict())
    assert back.state_dict()["scale"][0] == 1024.0 and back._incr_every_n_steps == 1


# --------------------------------------------------------------------------- decorate
@pytest.mark.parametrize("kwargs", [dict(level="O"), dict(level="o1"), dict(level="O3"), dict(dtype="fp16"),
                                    dict(dtype="Float16"), dict(dtype="float32")])
def test_decorate_rejects_what_paddle_rejects_also_on_a_cpu(kwargs):
    model = paddle.nn.Linear(2, 2)
    assert outcome(lambda: paddle.amp.decorate(model, **kwargs)) == ("raises", ValueError)
    key, value = next(iter(kwargs.items()))
    with pytest.raises(ValueError, match=rf"decorate {key} must be .* Received: {key}={value!r}"):
        amp.decorate(model, **kwargs)


def test_decorate_accepts_what_paddle_accepts():
    model = paddle.nn.Linear(2, 2)
    for level in ("O1", "O2"):
        for dtype in ("float16", "bfloat16"):
            assert amp.decorate(model, level=level, dtype=dtype) is model
    with pytest.raises(ValueError, match="save_dtype must be"):
        amp.decorate(model, level="O2", save_dtype="int8")
    with pytest.raises(TypeError, match=r"Pass either config= or \['level'\]"):
        amp.decorate(model, level="O2", config=amp.AmpConfig())


def test_auto_cast_enable_must_be_a_bool():
    with pytest.raises(TypeError, match=r"enable must be True or False. Received: enable='false'"):
        amp.auto_cast(enable="false")
    with amp.auto_cast(enable=np.bool_(False)):
        assert autocast_on() is False


def test_auto_cast_level_is_checked_at_the_call_naming_the_value():
    with pytest.raises(ValueError, match=r"^auto_cast level must be one of \('O0', 'OD', 'O1', 'O2'\) \(as in "
                                         r"paddle\.amp\.auto_cast: .*\)\. Received: level='O3'$"):
        amp.auto_cast(level="O3")  # before any `with`: Paddle would raise only there, without the value
    with pytest.raises(TypeError, match=r"auto_cast level must be a str, one of .*Received: level=2 \(of type int\)"):
        amp.auto_cast(level=2)
    with amp.routed(), pytest.raises(ValueError, match="Received: level='O3'"):
        paddle.amp.auto_cast(True, None, None, "O3")  # routed, positional, as a toolkit calls it
    for level in ("O0", "od", "O1", "o2"):  # what Paddle accepts, either case, still passes
        with amp.auto_cast(level=level):
            pass


# --------------------------------------------------------------------------- the gate where Paddle decides
def test_rocm_xpu_and_custom_devices_follow_paddles_rule():
    rocm = decide_by_support("auto", fp16=True, bf16=True, device="ROCm GPU 0", rule="Paddle 3.3.1's rule for ROCm")
    assert (rocm.dtype, rocm.use_loss_scaling) == ("bfloat16", False) and "ROCm" in rocm.reason
    fp16_only = decide_by_support("auto", fp16=True, bf16=False, device="XPU 0", rule="Paddle's XPU check")
    assert (fp16_only.dtype, fp16_only.use_loss_scaling) == ("float16", True)
    assert "Paddle's XPU check" in fp16_only.reason
    none = decide_by_support("float16", fp16=False, bf16=False, device="custom device", rule="Paddle's check")
    assert none.dtype == "float32" and none.fallback
    with pytest.raises(amp.AmpUnsupportedError, match="does not support bfloat16"):
        decide_by_support("bfloat16", fp16=True, bf16=False, device="XPU 0", rule="r", strict=True)


def test_a_rocm_build_asks_paddles_own_rule(monkeypatch):
    from paddle_amp_ext import device

    monkeypatch.setattr(paddle, "is_compiled_with_rocm", lambda: True)
    monkeypatch.setattr(device, "probe_accelerator", lambda kind=None: Accelerator("rocm", name="MI250X",
                                                                                   compute_capability=(9, 0)))
    device.current_decision.cache_clear()
    decision = device.current_decision("auto")
    expected = ("bfloat16", "allows float16 and bfloat16 AMP on every ROCm build") if device._compat.PADDLE_VERSION[0] >= 3 \
        else ("float16", "bfloat16 needs CUDA 11, which a ROCm build does not have")
    assert decision.dtype == expected[0] and "ROCm GPU 0 (MI250X)" in decision.reason and expected[1] in decision.reason
    device.current_decision.cache_clear()
