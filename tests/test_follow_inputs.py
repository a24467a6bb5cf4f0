"""The rehearsal follows Paddle's AMP rules op by op: white ops round, "follow the inputs" ops stay
in fp16 when their inputs are, black ops and float32 inputs stay float32; exact fp16 rounding."""

from __future__ import annotations

import gc
import importlib

import numpy as np
import paddle
import pytest
from helpers import fp16

import paddle_amp_ext as amp
from paddle_amp_ext._compat import kernels
from paddle_amp_ext.rehearsal import lowprec
from paddle_amp_ext.rehearsal.rounding import round_trip, round_values

F = paddle.nn.functional


def fp16_grid():
    """Every finite fp16 value, the midpoints to its upper neighbour, and one float32 ulp either
    side of each midpoint: every rounding decision, ties included, of the whole fp16 range."""
    halves = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16)
    values = halves.astype(np.float64)
    upper = np.append(values[1:], 65536.0)  # the next power of two after 65504: its midpoint rounds to inf
    mid = ((values + upper) / 2).astype(np.float32)
    grid = np.concatenate([values.astype(np.float32), mid, np.nextafter(mid, np.float32(0)),
                           np.nextafter(mid, np.float32(np.inf))])
    grid = np.concatenate([grid, -grid, np.array([np.inf, -np.inf, 3.4e38, 1e-45, 2.0**-25, 2.0**-14],
                                                 dtype=np.float32)])
    return grid.astype(np.float32)


def test_float16_rounding_is_exact_on_every_decision_of_the_range(fp16_kernel):
    grid = fp16_grid()
    got = kernels.round_to_float16(paddle.to_tensor(grid)).numpy()
    expected = fp16(grid)
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    assert same.all(), f"first differences: {grid[~same][:5]} -> {got[~same][:5]} (numpy: {expected[~same][:5]})"
    assert np.isnan(kernels.round_to_float16(paddle.to_tensor([np.nan, -np.nan])).numpy()).all()
    if fp16_kernel == "native":  # F16C keeps the sign of a negative value flushed to zero, as float16 does
        assert np.signbit(kernels.round_to_float16(paddle.to_tensor([-1e-9, -0.0])).numpy()).all()


def test_large_tensors_reuse_a_scratch_buffer_only_while_a_rehearsal_runs(monkeypatch):
    """Paddle's kernels (where the one-pass kernel cannot be had) round large tensors in a kept
    buffer."""
    monkeypatch.setattr(kernels, "fp16_rounder", lambda: None)
    rng = np.random.default_rng(0)
    size = kernels.SCRATCH.min_numel
    with amp.rehearse():
        for _ in range(2):  # the second call rounds in the buffer the first one left
            values = (rng.standard_normal(size) * 10.0 ** rng.integers(-9, 6, size)).astype(np.float32)
            np.testing.assert_array_equal(round_values(paddle.to_tensor(values)).numpy(), fp16(values))
        assert kernels.SCRATCH.take(paddle.to_tensor(values), size) is not None
    assert kernels.SCRATCH.take(paddle.to_tensor(values), size) is None, "dropped when the rehearsal ends"
    round_values(paddle.to_tensor(values))
    assert kernels.SCRATCH.take(paddle.to_tensor(values), size) is None, "and none kept outside one"


def test_round_trip_rounds_the_gradient_and_keeps_the_input():
    x = paddle.to_tensor([1.0 + 2.0**-12, 70000.0, 1e-9], stop_gradient=False)
    before = x.numpy().copy()
    y = round_trip(x, "float16")
    np.testing.assert_array_equal(y.numpy(), fp16(before))
    np.testing.assert_array_equal(x.numpy(), before)
    (y * paddle.to_tensor([1e-9, 3.0, 1.0 + 2.0**-12])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), fp16([1e-9, 3.0, 1.0 + 2.0**-12]))


def low_value(value, width=4):
    """A Linear output (low precision under the rehearsal: no bias, which Paddle 2.6 adds in
    float32) equal to ``value`` everywhere."""
    layer = paddle.nn.Linear(width, width, bias_attr=False)
    layer.weight.set_value(paddle.eye(width) / width)
    return layer, paddle.full([2, width], value * width)


FOLLOW = {
    "a * a": lambda a: a * a,
    "paddle.multiply": lambda a: paddle.multiply(a, a),
    "a * scalar": lambda a: a * 300.0,
    "reshape": lambda a: paddle.reshape(a, [-1]) * 300.0,
    "transpose, slice, concat": lambda a: paddle.concat([a.transpose([1, 0])[0], a[0]]) * 300.0,
    "split": lambda a: paddle.split(a, 2, axis=1)[0] * 300.0,
}


@pytest.mark.parametrize("name", sorted(FOLLOW))
def test_follow_the_inputs_ops_stay_fp16_when_their_inputs_are(name):
    op = FOLLOW[name]
    layer, x = low_value(300.0)
    assert np.isfinite(op(layer(x)).numpy()).all(), "90000 fits float32"
    with amp.fp16_emulation(layer):
        assert np.isposinf(op(layer(x)).numpy()).all(), "in fp16 the product overflows"
        with amp.auto_cast(custom_black_list=["elementwise_mul"]):
            assert np.isfinite(op(layer(x)).numpy()).all(), "black-listed: float32"
        with amp.auto_cast(enable=False):
            assert np.isfinite(op(layer(x)).numpy()).all()


def test_an_op_with_a_float32_input_runs_in_float32():
    layer, x = low_value(300.0)
    with amp.fp16_emulation(layer):
        h = layer(x)
        other = paddle.full_like(h, 300.0)  # made outside any low-precision op: float32
        assert np.isfinite((h * other).numpy()).all()
        out = h + paddle.full_like(h, 2.0**-12)
        assert not np.array_equal(out.numpy(), fp16(out.numpy())), "a float32 add is not rounded"
        low = h + h * 2.0**-12
        np.testing.assert_array_equal(low.numpy(), fp16(low.numpy()))


def test_the_backward_of_a_follow_op_is_rounded_where_fp16_would_hold_it():
    """dz = 2e-8 underflows fp16 (below 2**-25), dh = 4e-8 does not: only a rounded z kills it."""
    def grad_of_weight(rehearse, black=()):
        paddle.seed(0)
        layer = paddle.nn.Linear(4, 4, bias_attr=False)  # Paddle 2.6 adds a bias in float32
        x = paddle.ones([2, 4])
        if rehearse:
            with amp.fp16_emulation(layer, custom_black_list=list(black)):
                ((layer(x) * 2.0).sum() * 2e-8).backward()
        else:
            ((layer(x) * 2.0).sum() * 2e-8).backward()
        return layer.weight.grad.numpy()

    assert (grad_of_weight(False) != 0).all()
    assert (grad_of_weight(True) == 0).all()
    assert (grad_of_weight(True, black=["elementwise_mul"]) != 0).all()


def test_the_paddle_tensor_module_is_rounded_too():
    """nn.MultiHeadAttention calls the module paddle.tensor's matmul for weights @ v (another
    object than paddle.matmul on 3.x), and its reshape/transpose."""
    tensor_module = importlib.import_module("paddle.tensor")
    a = paddle.full([2, 2], 1e-5)
    with amp.rehearse():
        assert (tensor_module.matmul(a, a).numpy() == 0).all()
        assert (importlib.import_module("paddle.tensor.linalg").matmul(a, a).numpy() == 0).all()
    assert (tensor_module.matmul(a, a).numpy() != 0).all()


def test_functional_conv_is_rounded():
    x = paddle.full([1, 1, 3, 3], 300.0)
    w = paddle.full([1, 1, 1, 1], 300.0)
    assert np.isfinite(F.conv2d(x, w).numpy()).all()
    with amp.rehearse():
        assert np.isposinf(F.conv2d(x, w).numpy()).all()


def test_conv_layers_take_rounded_weights_and_batchnorm_follows_its_input():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(1, 2, 1, bias_attr=False), paddle.nn.BatchNorm2D(2))
    conv, norm = model[0], model[1]
    conv.weight.set_value(paddle.full(conv.weight.shape, 1.0 + 2.0**-12))  # fp16 holds 1.0
    x = paddle.rand([2, 1, 4, 4]) + 1.0
    weight = conv.weight
    with amp.fp16_emulation(model):
        out = conv(x)
        np.testing.assert_array_equal(out.numpy(), np.repeat(fp16(x.numpy()), 2, axis=1))
        assert conv.weight is weight, "the parameter is back after the forward"
        normed = norm(out)
        np.testing.assert_array_equal(normed.numpy(), fp16(normed.numpy()))
        normed_fp32 = norm(x.tile([1, 2, 1, 1]) * 1.001)
        assert not np.array_equal(normed_fp32.numpy(), fp16(normed_fp32.numpy())), "a float32 input: float32"
        model(x).mean().backward()
    grad = conv.weight.grad.numpy()
    np.testing.assert_array_equal(grad, fp16(grad))
    assert list(conv.state_dict()) == ["weight"] and conv.weight is weight


def test_a_forward_that_raises_gives_the_weights_back():
    class Broken(paddle.nn.Conv2D):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("boom")

    layer = Broken(1, 1, 1)
    weight = layer.weight
    with pytest.raises(RuntimeError, match="boom"):
        with amp.fp16_emulation(layer):
            layer(paddle.ones([1, 1, 2, 2]))
    assert layer.weight is weight and layer._parameters["weight"] is weight


def test_marks_die_with_their_tensors():
    gc.collect()
    before = lowprec.count()
    layer, x = low_value(2.0)
    with amp.fp16_emulation(layer):
        outs = [layer(x) * 2.0 for _ in range(5)]
        assert lowprec.count() >= before + 5
    del outs
    gc.collect()
    assert lowprec.count() == before


def test_marks_are_per_dtype():
    """A tensor holding fp16 values is not a bf16 value: a bf16 rehearsal rounds it again."""
    layer, x = low_value(1.0 + 2.0**-9)  # fp16 holds it, bf16 (8 bits) does not
    with amp.fp16_emulation(layer):
        h = layer(x)
    with amp.rehearse("bfloat16"):
        out = paddle.matmul(h, paddle.eye(4))
    assert (out.numpy() == 1.0).all()


def test_at_o2_every_op_but_the_black_listed_runs_in_fp16():
    a = paddle.full([2, 2], 300.0)
    assert np.isfinite((a * a).numpy()).all()
    with amp.rehearse(level="O2", use_promote=False):
        assert np.isposinf((a * a).numpy()).all(), "O2: float32 inputs are cast to fp16 too"
        assert np.isposinf(paddle.add(a * 200.0, a * 200.0).numpy()).all(), "60000 + 60000"
        table = paddle.full([3, 2], 1.0 + 2.0**-12)
        rows = F.embedding(paddle.to_tensor([0, 2]), table)
        assert (rows.numpy() == 1.0 + 2.0**-12).all(), "lookup_table_v2 is on Paddle's O2 black list: float32"
        probs = F.softmax(paddle.to_tensor([[1.0, 1.0 + 2.0**-12]]))
        assert np.array_equal(probs.numpy(), fp16(probs.numpy())), "Paddle's O2 black list has no softmax"
    with amp.rehearse(level="O1"):
        assert np.isfinite((a * a).numpy()).all(), "O1: a float32 multiply stays float32"
        probs = F.softmax(paddle.to_tensor([[1.0, 1.0 + 2.0**-12]]))
        assert not np.array_equal(probs.numpy(), fp16(probs.numpy())), "O1: softmax is black-listed: float32"


@pytest.mark.parametrize("build", ["conv", "linear"])
def test_large_outputs_rounded_in_their_own_buffer_train_the_same(build, monkeypatch, fp16_kernel):
    """Conv and BatchNorm layer outputs and compute-op outputs (with Paddle's kernels: of 1M
    elements and more) are rounded in place (no fresh buffer to fault in): values and gradients
    as the copying path."""
    def run():
        paddle.seed(0)
        if build == "conv":
            model = paddle.nn.Sequential(paddle.nn.Conv2D(2, 64, 3, padding=1, bias_attr=False), paddle.nn.BatchNorm2D(64),
                                         paddle.nn.ReLU(), paddle.nn.Conv2D(64, 1, 1))
            x = paddle.rand([4, 2, 64, 64])
        else:
            model = paddle.nn.Sequential(paddle.nn.Linear(64, 1024, bias_attr=False), paddle.nn.GELU(),
                                         paddle.nn.Linear(1024, 1))
            x = paddle.rand([1024, 64])
        with amp.fp16_emulation(model):
            out = model(x)
            (out * out).mean().backward()
        return out.numpy(), [p.grad.numpy() for p in model.parameters() if p.grad is not None]

    from paddle_amp_ext.rehearsal import rounding

    calls = []
    apply = rounding._RoundTripInPlace.apply
    monkeypatch.setattr(rounding._RoundTripInPlace, "apply", lambda x, dtype: calls.append(x.shape) or apply(x, dtype))
    in_place_out, in_place_grads = run()
    # conv: both outputs; linear: GELU's (a Linear's own output is rounded in place inside its
    # one-node linear, tests/test_fused_linear.py)
    assert len(calls) >= (2 if build == "conv" else 1), "the large outputs took the in-place path"
    monkeypatch.setattr(rounding, "rounds_in_place", lambda numel, dtype: False)  # every rounding copies
    copy_out, copy_grads = run()
    np.testing.assert_array_equal(in_place_out, copy_out)
    assert len(in_place_grads) == len(copy_grads) > 0
    for a, b in zip(in_place_grads, copy_grads):
        np.testing.assert_array_equal(a, b)


def test_an_output_sharing_its_inputs_memory_leaves_the_callers_tensor_alone(fp16_kernel):
    """``einsum('ij->ij', x)`` returns a new tensor on x's memory (both versions); outputs are
    rounded in their own buffer, so only rounded inputs may be shared, never the caller's."""
    values = np.array([[1.0 + 2.0**-12, 70000.0], [1e-9, 3.0]], dtype=np.float32)
    x = paddle.to_tensor(values)
    with amp.rehearse():
        y = paddle.einsum("ij->ij", x)
        z = F.dropout(x, 0.0)  # the same tensor back
        half = paddle.to_tensor(fp16(values[:, :1]))
        w = lowprec.mark(half, "float16") * 1.0
    np.testing.assert_array_equal(x.numpy(), values)
    np.testing.assert_array_equal(y.numpy(), fp16(values))
    np.testing.assert_array_equal(z.numpy(), values)
    np.testing.assert_array_equal(w.numpy(), fp16(values[:, :1]))
