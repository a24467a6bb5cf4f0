"""GradScaler and AmpConfig given settings a hostile user passes: float32 bounds, odd scale types,
a model where the optimizer belongs, a JSON config with a key given twice."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp

import paddle_amp_ext as amp
from paddle_amp_ext.config import FLOAT32_MAX

INF32 = (r"is inf as a float32 \(the loss scale is a float32 tensor, whose largest value is "
         r"3.4028234663852886e\+38\): a scale there would make every scaled gradient inf and skip every step. "
         r"Use a value <= 3.4028234663852886e\+38 \(max_loss_scaling's default\).")
ZERO32 = (r"is 0 as a float32 \(the loss scale is a float32 tensor, whose smallest positive value is "
          r"1.401298464324817e-45\): use a value >= 1.0 for a loss scale.")

BEYOND_FLOAT32 = [
    (dict(init_loss_scaling=1e39, max_loss_scaling=1e39), r"init_loss_scaling=1e\+39 " + INF32),
    (dict(max_loss_scaling=1e300), r"max_loss_scaling=1e\+300 " + INF32),
    (dict(init_loss_scaling=2.0**128, max_loss_scaling=2.0**128), r"init_loss_scaling=3.402823669209385e\+38 "),
    (dict(min_loss_scaling=1e-46, init_loss_scaling=1e-46), r"init_loss_scaling=1e-46 " + ZERO32),
    (dict(min_loss_scaling=2.0**-150), r"min_loss_scaling=7.006492321624085e-46 " + ZERO32),
]


@pytest.mark.parametrize("settings, message", BEYOND_FLOAT32, ids=lambda v: str(v)[:40])
@pytest.mark.parametrize("where", ["GradScaler", "AmpConfig", "load_state_dict"])
def test_a_scale_or_bound_beyond_float32_is_refused_naming_it_and_the_limit(settings, message, where):
    if where == "GradScaler":
        with pytest.raises(ValueError, match=message):
            amp.GradScaler(**settings)
    elif where == "AmpConfig":
        with pytest.raises(ValueError, match=message):
            amp.AmpConfig(**settings)
    else:
        scaler = amp.GradScaler(init_loss_scaling=1024.0)
        state = scaler.state_dict()
        keys = {"init_loss_scaling": "scale", "min_loss_scaling": "min_loss_scaling",
                "max_loss_scaling": "max_loss_scaling"}
        for key, value in settings.items():
            state[keys[key]] = np.array([value]) if key == "init_loss_scaling" else value
        before = scaler.state_dict()
        with pytest.raises(ValueError, match="Scaler state dict: " + message):
            scaler.load_state_dict(state)
        assert scaler.state_dict()["max_loss_scaling"] == before["max_loss_scaling"]
        assert scaler.loss_scale == 1.0 and scaler.state_dict()["scale"][0] == 1024.0  # nothing loaded


def test_set_init_loss_scaling_beyond_float32_is_refused():
    scaler = amp.GradScaler(init_loss_scaling=1024.0, max_loss_scaling=FLOAT32_MAX)
    with pytest.raises(ValueError, match=r"init_loss_scaling=1e\+39 " + INF32):
        scaler.set_init_loss_scaling(1e39)
    assert scaler.state_dict()["scale"][0] == 1024.0


def test_the_largest_float32_and_a_value_that_rounds_to_it_are_accepted():
    for value in (FLOAT32_MAX, 3.4028235e38, 2.0**128 - 2.0**103 - 2.0**80):
        scaler = amp.GradScaler(init_loss_scaling=value, max_loss_scaling=value)
        assert np.isfinite(scaler.state_dict()["scale"]).all()
        assert np.float32(scaler.state_dict()["scale"][0]) == np.float32(FLOAT32_MAX)
    assert amp.GradScaler(min_loss_scaling=2.0**-149, init_loss_scaling=1.0).state_dict()["min_loss_scaling"] == 2.0**-149


@pytest.mark.parametrize("scale", ["1024", True, False, np.array(["1024"]), np.array([True]), None, object(),
                                   b"1024", {"value": 1024}], ids=repr)
def test_a_state_dict_scale_that_is_not_a_number_is_a_type_error(scale):
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    state = scaler.state_dict()
    state["scale"] = scale
    with pytest.raises(TypeError, match=r"Scaler state dict key 'scale' must be a number or a 1-element float "
                                        r"array, as GradScaler.state_dict\(\) saves it. Received: .+ \(of type \w+\)"):
        scaler.load_state_dict(state)
    assert scaler.state_dict()["scale"][0] == 1024.0


@pytest.mark.parametrize("scale", [np.array([2048.0], dtype=np.float32), 2048, 2048.0, np.float64(2048), [2048.0],
                                   np.array(2048)], ids=repr)
def test_a_state_dict_scale_that_is_a_number_loads(scale):
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    state = scaler.state_dict()
    state["scale"] = scale
    scaler.load_state_dict(state)
    assert scaler.state_dict()["scale"][0] == 2048.0


@pytest.mark.parametrize("setting", ["init_loss_scaling", "max_loss_scaling", "min_loss_scaling"])
@pytest.mark.parametrize("value", ["1024", True], ids=repr)
def test_string_and_bool_settings_are_type_errors_everywhere(setting, value):
    message = rf"{setting} must be a number. Received: {setting}={value!r} \(of type {type(value).__name__}\)"
    with pytest.raises(TypeError, match=message):
        amp.GradScaler(**{setting: value})
    with pytest.raises(TypeError, match=message):
        amp.AmpConfig(**{setting: value})
    scaler = amp.GradScaler()
    state = scaler.state_dict()
    state[setting] = value
    if setting != "init_loss_scaling":
        with pytest.raises(TypeError, match="Scaler state dict: " + message):
            scaler.load_state_dict(state)
    else:
        with pytest.raises(TypeError, match=r"init_loss_scaling must be a number"):
            scaler.set_init_loss_scaling(value)


@pytest.mark.parametrize("method", ["step", "unscale_", "minimize"])
def test_the_model_where_the_optimizer_belongs_is_named_as_the_mistake(method):
    model = make_mlp(seed=0)
    x, y = make_data()
    scaler = amp.GradScaler()
    scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
    with pytest.raises(TypeError, match=rf"GradScaler.{method}\(\) takes the optimizer, not the model: call "
                                        rf"scaler.{method}\(optimizer\) with the paddle.optimizer that updates the "
                                        r"model. Received: a Sequential layer"):
        getattr(scaler, method)(model)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    assert not scaler.step(opt).skipped  # the mistake left nothing half done


@pytest.mark.parametrize("thing", [None, "adam", object(), [1]], ids=repr)
def test_something_without_step_is_refused_as_an_optimizer(thing):
    with pytest.raises(TypeError, match=r"GradScaler.step\(\) takes an optimizer \(an object with a step\(\) method, "
                                        r"such as paddle.optimizer.AdamW\). Received: .+ \(of type \w+\)"):
        amp.GradScaler().step(thing)


@pytest.mark.parametrize("text, key, values", [
    ('{"init_loss_scaling": 1024, "dtype": "float16", "init_loss_scaling": 2048}', "init_loss_scaling", "1024, then 2048"),
    ('{"amp": {"level": "O1", "level": "O2"}}', "level", "'O1', then 'O2'"),
    ('{"amp": {"dtype": "float16"}, "amp": {"dtype": "bfloat16"}}', "amp", "{'dtype': 'float16'}, then "
                                                                           "{'dtype': 'bfloat16'}"),
    ('{"other": {"x": 1, "x": 2}, "amp": {}}', "x", "1, then 2"),
])
def test_a_json_config_with_a_key_given_twice_is_an_error_naming_the_key(tmp_path, text, key, values):
    path = tmp_path / "amp.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        amp.AmpConfig.from_file(path)
    assert str(info.value) == (f"Config file '{path}': key '{key}' is given twice (values {values}); JSON would keep "
                               "the last silently: keep one")
    toml = tmp_path / "amp.toml"
    toml.write_text('init_loss_scaling = 1024\ninit_loss_scaling = 2048\n')
    with pytest.raises(ValueError, match=r"is not valid toml"):  # the TOML twin, as before
        amp.AmpConfig.from_file(toml)


def test_a_json_config_with_distinct_keys_still_loads(tmp_path):
    path = tmp_path / "amp.json"
    path.write_text('{"amp": {"init_loss_scaling": 1024, "dtype": "float16"}, "tool": {"init_loss_scaling": 1}}')
    assert amp.AmpConfig.from_file(path).init_loss_scaling == 1024.0
