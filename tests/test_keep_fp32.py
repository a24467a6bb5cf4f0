"""keep_fp32: a layer (or named sublayers) stays float32 where the rest is low precision."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.rehearsal import quantize


def two_layer_model():
    paddle.seed(7)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 4))
    model.add_sublayer("head", paddle.nn.Linear(4, 3))
    return model


def fp16_exact(t: paddle.Tensor) -> bool:
    return bool(np.array_equal(quantize(t).numpy(), t.numpy()))


def test_kept_layer_output_keeps_float32_precision_under_emulation():
    x = paddle.rand([5, 8])
    plain = two_layer_model()
    with amp.fp16_emulation(plain) as emulated:
        out = plain(x)
    assert emulated == ["0", "1", "head"]
    assert fp16_exact(out), "without keep_fp32 the head output is fp16-rounded"

    kept = amp.keep_fp32(two_layer_model(), ["head"])
    with amp.fp16_emulation(kept) as emulated:
        hidden = kept[1](kept[0](x))
        out = kept(x)
    assert emulated == ["0", "1"]
    assert fp16_exact(hidden), "the other layers are still fp16-rounded"
    assert not fp16_exact(out), "the kept head computes in float32"
    assert out.dtype == paddle.float32


def test_keep_fp32_by_class_name_and_whole_layer():
    model = two_layer_model()
    amp.keep_fp32(model, "Linear")
    assert all(amp.keep.is_kept_fp32(layer) for layer in model.children())
    single = paddle.nn.Linear(2, 2)
    assert amp.keep_fp32(single) is single and amp.keep.is_kept_fp32(single)
    amp.keep_fp32(single)  # idempotent: no double wrapping
    np.testing.assert_allclose(single(paddle.ones([1, 2])).numpy(),
                               (paddle.ones([1, 2]) @ single.weight + single.bias).numpy(), rtol=1e-6)


def test_kept_layer_casts_low_precision_inputs_to_float32():
    layer = amp.keep_fp32(paddle.nn.Linear(2, 2))
    out = layer(paddle.ones([1, 2], dtype="float16"))  # CPU has no fp16 matmul: the cast is required
    assert out.dtype == paddle.float32


def test_unknown_layer_name_suggests():
    with pytest.raises(ValueError, match=r"No sublayer named 'haed'.*Did you mean 'head'"):
        amp.keep_fp32(two_layer_model(), ["haed"])
    with pytest.raises(TypeError, match="expects a paddle.nn.Layer"):
        amp.keep_fp32("head")


def test_config_fp32_layers_apply_through_emulation_and_decorate(caplog_amp):
    cfg = amp.AmpConfig(fp32_layers=["head"], level="O2")
    model = two_layer_model()
    with amp.fp16_emulation(model, config=cfg) as emulated:
        assert amp.keep.is_kept_fp32(model.head)
    assert "head" not in emulated
    assert not amp.keep.is_kept_fp32(model.head), "the rehearsal's fp32 layers are released at exit"
    other = two_layer_model()
    assert amp.decorate(other, config=cfg) is other  # CPU: the gate keeps float32
    assert amp.keep.is_kept_fp32(other.head)
    assert all(p.dtype == paddle.float32 for p in other.parameters())
    assert "decorate(level='O2') leaves parameters in float32" in caplog_amp.text


# --------------------------------------------------------------------------- the kept layer is still a plain layer
class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.body = paddle.nn.Linear(8, 8)
        self.head = paddle.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(paddle.nn.functional.relu(self.body(x)))


def kept_net(seed: int = 0) -> Net:
    paddle.seed(seed)
    return amp.keep_fp32(Net(), ["head"])


def test_forward_is_not_replaced_and_the_class_name_is_kept():
    model = kept_net()
    assert "forward" not in model.head.__dict__
    assert type(model.head).__name__ == "Linear" and isinstance(model.head, paddle.nn.Linear)
    assert amp.keep.is_kept_fp32(model.head) and not amp.keep.is_kept_fp32(model.body)


def test_deepcopy_runs_and_trains_the_copys_own_weights():
    import copy

    model = kept_net()
    x = paddle.randn([4, 8])
    before = model(x).numpy()
    twin = copy.deepcopy(model)
    assert amp.keep.is_kept_fp32(twin.head)
    np.testing.assert_array_equal(twin(x).numpy(), before)
    twin.head.weight.set_value(paddle.zeros_like(twin.head.weight))
    np.testing.assert_array_equal(model(x).numpy(), before)  # the original is untouched
    twin(x).sum().backward()
    assert twin.head.weight.grad is not None
    assert model.head.weight.grad is None, "gradients go to the copy's weights, not the original's"


def test_pickles_wherever_the_plain_model_pickles():
    import pickle

    try:
        pickle.dumps(Net())
    except TypeError as exc:  # Paddle 2.6: parameters do not pickle at all
        pytest.skip(f"a plain model does not pickle on Paddle {paddle.__version__}: {exc}")
    model = kept_net()
    x = paddle.randn([4, 8])
    back = pickle.loads(pickle.dumps(model))
    assert amp.keep.is_kept_fp32(back.head) and not amp.keep.is_kept_fp32(back.body)
    np.testing.assert_array_equal(back(x).numpy(), model(x).numpy())


def test_state_dict_keys_are_unchanged_and_load_both_ways(tmp_path):
    model, plain = kept_net(1), Net()
    assert list(model.state_dict()) == list(plain.state_dict())
    paddle.save(model.state_dict(), str(tmp_path / "kept.pdparams"))
    plain.set_state_dict(paddle.load(str(tmp_path / "kept.pdparams")))
    x = paddle.randn([3, 8])
    np.testing.assert_array_equal(plain(x).numpy(), model(x).numpy())
    again = kept_net(2)
    again.set_state_dict(paddle.load(str(tmp_path / "kept.pdparams")))
    np.testing.assert_array_equal(again(x).numpy(), model(x).numpy())


@pytest.mark.parametrize("full_graph", [True, False])
def test_to_static_model_with_a_kept_head_matches_dygraph(full_graph):
    x = paddle.randn([4, 8])
    dynamic = kept_net(3)
    static = paddle.jit.to_static(kept_net(3), full_graph=full_graph)
    np.testing.assert_allclose(static(x).numpy(), dynamic(x).numpy(), rtol=1e-6)


def test_jit_save_and_load_of_a_kept_model(tmp_path):
    model = kept_net(4)
    path = str(tmp_path / "model")
    paddle.jit.save(model, path, input_spec=[paddle.static.InputSpec([None, 8], "float32")])
    loaded = paddle.jit.load(path)
    x = paddle.randn([5, 8])
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)
    assert all(p.dtype == paddle.float32 for p in loaded.parameters())


@pytest.mark.skipif(amp._compat.PADDLE_VERSION < (3, 0, 0),
                    reason="Paddle 2.6's static graph has no auto_cast (AMP is a program rewrite there)")
def test_kept_layer_turns_autocast_off_inside_a_static_program():
    seen = {}

    class Probe(paddle.nn.Layer):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, x):
            seen[self.name] = paddle.amp.is_autocast_enabled()
            return x

    model = paddle.nn.Sequential(Probe("plain"), amp.keep_fp32(Probe("kept")))
    paddle.enable_static()
    try:
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            x = paddle.static.data("x", [2, 4], "float32")
            with amp.auto_cast(dtype="float16"):
                model(x)
                after = paddle.amp.is_autocast_enabled()
    finally:
        paddle.disable_static()
    assert seen == {"plain": True, "kept": False} and after is True


@pytest.mark.parametrize("name,what", [("", "the model's own path"), ("Sequential", "the model's own class")])
def test_a_name_for_the_whole_model_is_refused(name, what):
    model = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=rf"^fp32 layer name '{name}' is {what}: it would keep the whole model in "
                                         r"float32, which is no AMP at all\. Name its sublayers by path "
                                         r"\(e\.g\. \['0', '1'\]\) or class; to keep all of it, call "
                                         r"keep_fp32\(model\) without names"):
        amp.keep_fp32(model, [name])
    assert not any(amp.keep.is_kept_fp32(layer) for layer in model.sublayers(include_self=True)), "nothing kept"
    with pytest.raises(ValueError, match=f"fp32 layer name '{name}' is {what}"):
        amp.keep_fp32(model, name)  # a single str too


def test_a_config_naming_the_models_class_is_refused_where_the_model_is_known():
    model = paddle.nn.Sequential(paddle.nn.Linear(2, 2))
    config = amp.AmpConfig(fp32_layers=["Sequential"], level="O2")
    for use in (lambda: amp.fp16_emulation(model, config=config).__enter__(),
                lambda: amp.decorate(model, config=config)):
        with pytest.raises(ValueError, match="fp32 layer name 'Sequential' is the model's own class"):
            use()
    assert not amp.keep.is_kept_fp32(model)


def test_config_refuses_the_empty_layer_name():
    with pytest.raises(ValueError, match=r"^fp32_layers=\['head', ''\] contains '', the model's own name: it would "
                                         r"keep the whole model in float32, which is no AMP at all\. Name sublayers "
                                         r"by path \('head', 'encoder\.norm'\) or class \('LayerNorm'\); for a "
                                         r"float32 model, turn AMP off \(enable=False\)\.$"):
        amp.AmpConfig(fp32_layers=["head", ""])
    with pytest.raises(ValueError, match="contains '', the model's own name"):
        amp.AmpConfig.from_dict({"fp32_layers": [""]})
