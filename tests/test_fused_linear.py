"""The one-node rehearsed Linear (rehearsal/fused.py) gives the op-by-op path's bits, forward and backward."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import fp16

import paddle_amp_ext as amp
from paddle_amp_ext._compat import gpu_linear_is_fused
from paddle_amp_ext.rehearsal import fused, rounding

F = paddle.nn.functional


def op_by_op(monkeypatch):
    """Turn the one-node path off: every linear runs op by op."""
    monkeypatch.setattr(fused, "linear", lambda *args, **kwargs: None)


def train(shape, dtype, bias=True, x_grad=True, frozen=False, level="O1", use_promote=True):
    """Outputs and gradients of a small Linear-ReLU-Linear-ReLU-Linear model under the rehearsal."""
    paddle.seed(3)
    bias_attr = None if bias else False
    model = paddle.nn.Sequential(paddle.nn.Linear(shape[-1], 48, bias_attr=bias_attr), paddle.nn.ReLU(),
                                 paddle.nn.Linear(48, 40, bias_attr=bias_attr), paddle.nn.ReLU(),
                                 paddle.nn.Linear(40, 3, bias_attr=bias_attr))
    if frozen:
        model[2].weight.stop_gradient = True
    x = paddle.randn(shape) * 3.0
    x.stop_gradient = not x_grad
    with amp.fp16_emulation(model, dtype):
        with amp.auto_cast(dtype=dtype, level=level, use_promote=use_promote):
            out = model(x)
        (out * out * 1000.0).sum().backward()  # gradients large enough to round visibly
    grads = [p.grad.numpy() for p in model.parameters() if p.grad is not None]
    return [out.numpy()] + ([x.grad.numpy()] if x_grad else []) + grads


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [
    dict(shape=[32, 24]), dict(shape=[4, 8, 24]), dict(shape=[24]), dict(shape=[32, 24], bias=False),
    dict(shape=[32, 24], x_grad=False), dict(shape=[32, 24], frozen=True), dict(shape=[32, 24], level="O2"),
    dict(shape=[32, 24], level="O2", use_promote=False),
], ids=["2d", "3d", "1d", "no-bias", "x-no-grad", "frozen-weight", "O2", "O2-no-promote"])
def test_one_node_linear_gives_the_op_by_op_bits(dtype, case, fp16_kernel, monkeypatch):
    calls = []
    apply = fused._Linear.apply
    monkeypatch.setattr(fused._Linear, "apply", lambda *a: calls.append(1) or apply(*a))
    one_node = train(dtype=dtype, **case)
    assert len(calls) == 3, "every Linear took the one-node path (on 2.6 at O2 without promotion the\
 product alone: the bias add is low precision there, run op by op)"
    op_by_op_26 = case.get("use_promote") is False and case.get("bias", True) and not gpu_linear_is_fused()
    op_by_op(monkeypatch)
    reference = train(dtype=dtype, **case)
    assert len(one_node) == len(reference)
    for a, b in zip(one_node, reference):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    if case.get("bias", True) and not gpu_linear_is_fused() and not op_by_op_26:
        return  # 2.6.2 adds the bias in float32: the outputs and the bias gradients are float32
    for value in one_node:  # every output and gradient holds dtype values
        assert np.array_equal(value, rounding.round_values(paddle.to_tensor(value), dtype).numpy())


def test_a_linear_is_one_autograd_node_without_rounding_nodes(monkeypatch):
    made = []
    for cls in (rounding._RoundTrip, rounding._RoundTripInPlace):
        original = cls.apply
        monkeypatch.setattr(cls, "apply", lambda *a, _o=original: made.append(1) or _o(*a))
    layer = paddle.nn.Linear(300, 200)
    x = paddle.randn([64, 300])
    with amp.fp16_emulation(layer):
        layer(x).sum().backward()
    assert made == [], "input, weight, bias and output rounded inside the one node"
    assert layer.weight.grad is not None and layer.bias.grad is not None


def test_no_grad_forward_matches_the_grad_forward():
    layer = paddle.nn.Linear(24, 16)
    x = paddle.randn([8, 24]) * 100.0
    with amp.fp16_emulation(layer):
        with_grad = layer(x).numpy()
        with paddle.no_grad():
            without = layer(x).numpy()
    np.testing.assert_array_equal(with_grad, without)
    assert np.array_equal(without, fp16(without))


def test_an_input_changed_in_place_after_the_forward_raises_naming_it():
    layer = paddle.nn.Linear(8, 8, bias_attr=False)
    x = paddle.randn([4, 8])
    x.stop_gradient = False
    with amp.fp16_emulation(layer):
        h = layer(x)  # a low-precision value that no backward saves: the next linear keeps it as it is
        out = layer(h)
        h.scale_(2.0)
        with pytest.raises((RuntimeError, OSError), match=r"The x of a rehearsed linear was changed in place .*clone"):
            out.sum().backward()


def test_a_patched_f_linear_is_called_op_by_op(monkeypatch):
    """The one-node path runs only where the callee is Paddle's own F.linear."""
    seen = []
    paddle_linear = F.linear

    def user_linear(x, weight, bias=None, name=None):
        seen.append(x.shape)
        return paddle_linear(x, weight, bias, name)

    monkeypatch.setattr(paddle.nn.functional, "linear", user_linear)
    monkeypatch.setattr(paddle.nn.functional.common, "linear", user_linear)
    layer = paddle.nn.Linear(4, 4)
    x = paddle.full([2, 4], 1.0 + 2.0**-12)  # fp16 rounds it to 1.0
    with amp.rehearse():
        out = paddle.nn.functional.linear(x, layer.weight, layer.bias)  # the wrapped user_linear
    assert seen == [[2, 4]]
    assert np.array_equal(out.numpy(), fp16(out.numpy()))


def test_two_graphs_alive_with_the_weight_changed_between_them_keep_their_own_copies(monkeypatch):
    """A rounded copy's buffer is used again only once the node that reads it is gone: a second
    forward while the first graph is alive, after an in-place update, gets a buffer of its own."""
    def run():
        paddle.seed(5)
        layer = paddle.nn.Linear(64, 32)
        x = paddle.randn([16, 64])
        x.stop_gradient = False  # x's gradient reads each node's weight copy
        with amp.fp16_emulation(layer):
            first = layer(x)
            with paddle.no_grad():
                layer.weight.scale_(1.5 + 2.0**-9)  # not an fp16 multiple: the copy must be redone
            second = layer(x)
            (first.sum() + 2.0 * second.sum()).backward()
            return first.numpy(), second.numpy(), x.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()

    pooled = run()
    op_by_op(monkeypatch)
    reference = run()
    for a, b in zip(pooled, reference):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(pooled[0], pooled[1])


def test_buffers_are_used_again_after_backward_and_dropped_when_the_rehearsal_ends():
    from paddle_amp_ext.rehearsal import pool

    layer = paddle.nn.Linear(256, 128)
    x = paddle.randn([32, 256])
    with amp.fp16_emulation(layer):
        layer(x).sum().backward()
        kept = pool.kept_bytes()
        assert kept >= 4 * (256 * 128 + 32 * 256), "the weight and input copies came back after backward"
        taken = []
        real_take = pool.Lease.take
        pool.Lease.take = lambda self, like: taken.append(pool.kept_bytes()) or real_take(self, like)
        try:
            layer(x).sum().backward()
        finally:
            pool.Lease.take = real_take
        assert taken and taken[0] == kept
        assert pool.kept_bytes() == kept, "the second step took the same buffers and gave them back"
        lease = pool.Lease()
        held = lease.take(x)
    assert pool.kept_bytes() == 0, "dropped when the rehearsal ended"
    lease.release()  # a lease from before the end hands nothing back
    assert pool.kept_bytes() == 0 and held.shape == [32, 256]
