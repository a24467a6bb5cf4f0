"""The doctor uses Paddle's own tensor checker for what no hook sees: weight gradients."""

from __future__ import annotations

import random

import numpy as np
import paddle

import paddle_amp_ext as amp
from paddle_amp_ext.rehearsal import checker


def weight_gradient_overflow():
    """out = 300 * 0.5 * 4 = 600 and dx = 0.5 * 250 fit fp16; dW = x * dOut = 300 * 250 = 75000 does not."""
    layer = paddle.nn.Linear(4, 4)
    layer.weight.set_value(paddle.full([4, 4], 0.5))
    return layer, paddle.full([1, 4], 300.0)


def test_the_doctor_names_a_weight_gradient_only_paddles_checker_sees(capsys):
    layer, x = weight_gradient_overflow()
    paddle.seed(7)
    np.random.seed(7)
    random.seed(7)
    expected = (paddle.rand([3]).numpy(), np.random.rand(3), random.random())
    paddle.seed(7)
    np.random.seed(7)
    random.seed(7)
    flags = checker._flags()

    report = amp.find_overflow(layer, x, loss_fn=lambda out: out.sum() * 250.0)

    np.testing.assert_array_equal(paddle.rand([3]).numpy(), expected[0])
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2], "the checker reseeds every generator; they are put back"
    assert checker._flags() == flags, "the checker's flags are put back"
    assert paddle.get_flags(["FLAGS_check_nan_inf"]) == {"FLAGS_check_nan_inf": False}
    assert capsys.readouterr().out == "", "Paddle's checker prints; the doctor does not let it"
    culprit = report.culprit
    assert culprit is not None and culprit.direction == "backward" and culprit.layer == ""
    assert culprit.op.startswith("matmul") and culprit.op.endswith("_grad")
    assert culprit.max_abs == 75000.0
    assert "Paddle's tensor checker" in str(report) and "keep_fp32" not in str(report)
    assert "custom_black_list=['matmul']" in str(report)


def test_what_the_layer_watch_names_is_not_repeated():
    """The attention logits: the doctor's own watch names matmul in self_attn; the checker's
    forward matmul line adds nothing."""
    paddle.seed(0)
    layer = paddle.nn.TransformerEncoderLayer(d_model=64, nhead=1, dim_feedforward=64, dropout=0.0)
    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
        proj.weight.set_value(paddle.zeros_like(proj.weight))
        proj.bias.set_value(paddle.full_like(proj.bias, 100.0))
    report = amp.find_overflow(layer, paddle.rand([2, 4, 64]))
    forward = [f for f in report.findings if f.direction == "forward"]
    assert [f.layer for f in forward if f.op and f.op.startswith("matmul")] == ["self_attn"]


def test_no_checker_for_bfloat16_or_a_custom_limit():
    layer, x = weight_gradient_overflow()
    assert not amp.find_overflow(layer, x, loss_fn=lambda out: out.sum() * 250.0, dtype="bfloat16")
    report = amp.find_overflow(layer, x, loss_fn=lambda out: out.sum() * 250.0, limit=1e5)
    assert not report


def test_checker_lines_are_parsed():
    lines = [
        "[PRECISION] in [device=cpu, op=matmul_grad, tensor=, dtype=fp32], numel=16, num_zero=0, "
        "max=7.500000e+04, min=7.500000e+04, mean=7.500000e+04",
        "[PRECISION] [ERROR] in [device=cpu, op=multiply, tensor=, dtype=fp32], numel=2, num_nan=0, "
        "num_inf=1, num_zero=0, max=inf, min=1.000000e+00, mean=inf",
        "[PRECISION] in [device=gpu:0, op=conv2d, tensor=Output, dtype=fp32], numel=4, num_zero=0, "
        "max=1.0e+00, min=-9.000000e+04, mean=0",
        "some other line",
    ]
    assert checker.parse(lines) == [("matmul_grad", 75000.0), ("multiply", float("inf")), ("conv2d", 90000.0)]


def test_only_low_precision_ops_not_yet_named_are_added():
    checked = [("matmul", 8e4), ("matmul_grad", 7.5e4), ("matmul_grad", 9e4), ("conv2d_grad", 1e5),
               ("scale_grad", 1e6), ("softmax", 7e4), ("conv2d", 100.0)]
    white = {"matmul_v2", "matmul", "conv2d"}
    named = {("matmul_v2", "forward")}  # what the doctor's own watch reported
    assert checker.unnamed(checked, white, named, 65504.0) == [
        ("matmul_grad", "matmul", "backward", 7.5e4), ("conv2d_grad", "conv2d", "backward", 1e5)]
