"""Hostile cases for the rehearsal's in-place rule (paddle_amp_ext._compat.backward, rehearsal.rounding)."""

from __future__ import annotations

import threading

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext._compat import backward
from paddle_amp_ext.rehearsal import rounding


@pytest.fixture
def fresh_table():
    backward.table.cache_clear()
    yield
    backward.table.cache_clear()


@pytest.mark.parametrize("version, major", [("4.0.0", "3"), ("3.0.0b1", "3"), ("2.5.0", "2"), ("0.0.0", "3")])
def test_a_paddle_without_a_table_of_its_own_uses_the_newest(version, major, monkeypatch, fresh_table):
    from paddle_amp_ext._compat.backward_table import QUIET, READS

    monkeypatch.setattr(paddle, "__version__", version)
    expected = {**dict.fromkeys(QUIET[major].split(), ((), ())), **READS[major]}
    assert backward.table() == expected
    assert backward.table()["SiluGradNode"] == (("out",), ("out",))


def test_a_leaf_parameter_and_an_int_tensor_are_handled():
    param = paddle.create_parameter([4], "float32")
    assert backward.saved_by_backward(param)  # GradNodeAccumulation: not an op's node, conservative
    assert not backward.saved_by_backward(paddle.to_tensor([1, 2, 3]))  # no gradient, no node


def test_an_output_read_twice_by_later_ops_keeps_both_gradients():
    """silu's output is read by silu's own node and by the multiply after it (``y * y``): rounded
    as a copy, neither node sees it change."""
    x = paddle.to_tensor(np.linspace(-3, 3, 8192, dtype=np.float32).reshape(64, 128))
    x.stop_gradient = False
    with amp.rehearse(custom_white_list=["silu", "elementwise_mul"]):
        y = F.silu(x)
        z = y * y
    z.sum().backward()
    expected = 2 * F.silu(x) * (F.sigmoid(x) * (1 + x * (1 - F.sigmoid(x))))
    error = np.max(np.abs(x.grad.numpy() - expected.numpy()))
    assert error <= 8 * 2.0**-11 * np.max(np.abs(expected.numpy()))  # the bound of tests/test_inplace_rounding.py


def test_an_empty_and_a_zero_dim_output_round_and_differentiate():
    """As Paddle's own backward does (2.6.2 gives an empty input no gradient at all)."""
    def grad(shape, rehearsed):
        x = paddle.ones(shape) if shape else paddle.to_tensor(0.5)
        x.stop_gradient = False
        if rehearsed:
            with amp.rehearse(custom_white_list=["silu"]):
                y = F.silu(x)
        else:
            y = F.silu(x)
        paddle.autograd.backward([y], [paddle.ones_like(y)])  # not y.sum(): 2.6.2 refuses to sum nothing
        return None if x.grad is None else x.grad.numpy()

    for shape in ([0, 5000], []):
        got, expected = grad(shape, True), grad(shape, False)
        assert (got is None) == (expected is None)
        if expected is not None:
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=2.0**-10)


def test_rehearsals_in_threads_each_keep_their_saved_outputs():
    errors: list = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            x = paddle.to_tensor(rng.standard_normal((64, 128)).astype(np.float32))
            x.stop_gradient = False
            with amp.rehearse("bfloat16" if seed % 2 else "float16", custom_white_list=["silu", "softmax", "tanh"]):
                y = F.softmax(F.silu(x)) + paddle.tanh(x)
            y.sum().backward()
            assert np.isfinite(x.grad.numpy()).all()
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []


def test_round_trip_asked_for_in_place_on_a_saved_output_copies_it(fp16_kernel):
    x = paddle.rand([64, 128])
    x.stop_gradient = False
    y = F.silu(x)
    pointer = y.data_ptr()
    rounded = rounding.round_trip(y, "float16", in_place=True)
    assert rounded is not y and y.data_ptr() == pointer and y.inplace_version == 0
    rounded.sum().backward()  # silu's node reads y: unchanged
    z = paddle.scale(x, 2.0)
    assert rounding.round_trip(z, "float16", in_place=True) is z or not rounding.rounds_in_place(8192, "float16")
