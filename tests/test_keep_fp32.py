"""keep_fp32: a layer (or named sublayers) stays float32 where the rest is low precision."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.emulation import quantize


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
    assert all(amp.autocast.is_kept_fp32(layer) for layer in model.children())
    single = paddle.nn.Linear(2, 2)
    assert amp.keep_fp32(single) is single and amp.autocast.is_kept_fp32(single)
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
        pass
    assert "head" not in emulated and amp.autocast.is_kept_fp32(model.head)
    other = two_layer_model()
    assert amp.decorate(other, config=cfg) is other  # CPU: the gate keeps float32
    assert amp.autocast.is_kept_fp32(other.head)
    assert all(p.dtype == paddle.float32 for p in other.parameters())
    assert "decorate(level='O2') leaves parameters in float32" in caplog_amp.text
