"""Inside a rehearsal, inf and NaN give what Paddle's CUDA kernels give (docs/nonfinite.md).

The expected values are numpy references of the CUDA formulas (softmax_gpudnn.h subtracts the
row maximum; cross_entropy_kernel.cu computes -(x[label] - max - log(sum)); the CUDA relu
gradient is ``out > 0 ? dout : 0``): read from Paddle's sources, not measured on a GPU.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812
import pytest

import paddle_amp_ext as amp

INF, NAN = np.float32(np.inf), np.float32(np.nan)
LENGTHS = (4, 8, 16, 128, 512)


def rows(n: int) -> np.ndarray:
    """One row per case: all +inf, one +inf, one NaN, all -inf (fully masked), one -inf
    (partly masked), finite."""
    base = np.linspace(-2.0, 2.0, n, dtype=np.float32)
    x = np.tile(base, (6, 1))
    x[0] = INF
    x[1, n // 2] = INF
    x[2, 1] = NAN
    x[3] = -INF
    x[4, 0] = -INF
    return x


BAD = np.array([True, True, True, True, False, False])  # rows a max-subtracting softmax makes NaN


def cuda_softmax(x: np.ndarray, g: np.ndarray, log: bool = False):
    with np.errstate(all="ignore"):
        m = np.fmax.reduce(x, axis=-1, keepdims=True)
        e = np.exp(x - m)
        s = e.sum(-1, keepdims=True)
        if log:
            y = x - m - np.log(s)
            return y, g - np.exp(y) * g.sum(-1, keepdims=True)
        y = e / s
        return y, y * (g - (g * y).sum(-1, keepdims=True))


def run(fn, x: np.ndarray, g: np.ndarray, rehearse: bool = True):
    t = paddle.to_tensor(x)
    t.stop_gradient = False
    if rehearse:
        with amp.rehearse():
            y = fn(t)
            (dx,) = paddle.grad(y, t, paddle.to_tensor(g))
    else:
        y = fn(t)
        (dx,) = paddle.grad(y, t, paddle.to_tensor(g))
    return y.numpy(), dx.numpy()


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(want) * np.sign(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_rows_holding_inf_or_nan_are_nan_forward_and_backward(n, log):
    x, g = rows(n), np.tile(np.linspace(0.5, 1.5, n, dtype=np.float32), (6, 1))
    fn = (lambda t: F.log_softmax(t)) if log else (lambda t: F.softmax(t))
    y, dx = run(fn, x, g)
    want_y, want_dx = cuda_softmax(x, g, log)
    assert_same(y, want_y)
    assert_same(dx, want_dx)
    assert np.isnan(y[BAD]).all() and np.isnan(dx[BAD]).all()
    assert np.isfinite(dx[~BAD]).all()
    assert (y[4, 0] == -INF) if log else (y[4, 0] == 0.0), "a masked entry of a finite row"


def test_without_the_rehearsal_the_cpu_kernel_gives_finite_rows_from_8_on():
    """The control: what the fix-up is for (Paddle's CPU softmax on 3.3.1 and 2.6.2)."""
    for n, finite in ((4, False), (8, True), (16, True)):
        y, _ = run(lambda t: F.softmax(t), rows(n)[[0, 3]], np.ones((2, n), np.float32), rehearse=False)
        assert bool(np.isfinite(y).all()) == finite
        if finite:
            np.testing.assert_array_equal(y, np.full((2, n), 1.0 / n, np.float32))


def test_nn_softmax_on_another_axis_and_in_a_float32_region_of_the_rehearsal():
    x = np.full((2, 8, 3), 1.0, np.float32)
    x[0, :, 1] = INF  # a column of +inf along axis 1
    with amp.rehearse():
        with amp.auto_cast(enable=False):
            y = paddle.nn.Softmax(axis=1)(paddle.to_tensor(x)).numpy()
    expected = np.full((2, 8, 3), 0.125, np.float32)
    expected[0, :, 1] = NAN
    np.testing.assert_array_equal(y, expected)


def cuda_cross_entropy(x: np.ndarray, label: np.ndarray, ignore: int = -100) -> np.ndarray:
    """Per-row loss: -(x[l] - max - log(sum(exp(x - max)))), 0 for an ignored label."""
    with np.errstate(all="ignore"):
        m = np.fmax.reduce(x, axis=-1, keepdims=True)
        logp = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
        safe = np.where(label == ignore, 0, label)
        loss = -np.take_along_axis(logp, safe[:, None], axis=-1)[:, 0]
        return np.where(label == ignore, 0.0, loss).astype(np.float32)


@pytest.mark.parametrize("n", LENGTHS)
def test_cross_entropy_of_rows_holding_inf_is_nan_and_an_ignored_row_stays_zero(n):
    x = rows(n)
    label = np.array([0, n // 2, 1, 2, 0, 3], np.int64)
    ignored_label = label.copy()
    ignored_label[3] = -100  # a fully masked row whose label is ignored: the GPU writes 0
    for lab in (label, ignored_label):
        expect_nan = BAD & (lab != -100)
        t = paddle.to_tensor(x)
        t.stop_gradient = False
        with amp.rehearse():
            loss = F.cross_entropy(t, paddle.to_tensor(lab[:, None]), reduction="none")
            (dx,) = paddle.grad(loss, t)
        loss = loss.numpy()[:, 0]
        want = cuda_cross_entropy(x, lab)
        assert_same(loss, want)
        assert loss[4] == INF, "the label's logit is -inf: -log(0)"
        assert np.isnan(dx.numpy()[expect_nan]).all() and np.isfinite(dx.numpy()[~expect_nan]).all()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_reduced_cross_entropy_is_nan_with_nan_gradients_only_in_that_row(reduction):
    x = np.zeros((3, 8), np.float32)
    x[1] = INF
    t = paddle.to_tensor(x)
    t.stop_gradient = False
    layer = paddle.nn.CrossEntropyLoss(reduction=reduction)
    with amp.fp16_emulation(layer):
        loss = layer(t, paddle.to_tensor([[1], [2], [3]], dtype="int64"))
        loss.backward()
    assert np.isnan(loss.numpy()).all()
    grad = t.grad.numpy()
    assert np.isnan(grad[1]).all() and np.isfinite(grad[[0, 2]]).all()
    plain = paddle.to_tensor(x[[0, 2]])
    plain.stop_gradient = False
    F.cross_entropy(plain, paddle.to_tensor([[1], [3]], dtype="int64"), reduction="sum").backward()
    scale = 1.0 / 3 if reduction == "mean" else 1.0
    np.testing.assert_allclose(grad[[0, 2]], plain.grad.numpy() * scale, rtol=1e-6)


def test_soft_label_cross_entropy_of_a_row_holding_inf_is_nan():
    x = np.zeros((2, 8), np.float32)
    x[0, 3] = INF
    label = np.full((2, 8), 1.0 / 8, np.float32)
    with amp.rehearse():
        loss = F.cross_entropy(paddle.to_tensor(x), paddle.to_tensor(label), soft_label=True, reduction="none")
    loss = loss.numpy().ravel()
    assert np.isnan(loss[0]) and loss[1] == pytest.approx(np.log(8.0), rel=1e-6)


@pytest.mark.parametrize("n", LENGTHS)
def test_relu_gradient_is_zero_where_the_unit_is_off_whatever_comes_back(n):
    x = np.linspace(-1.0, 1.0, n, dtype=np.float32)  # the first half is off
    g = np.ones(n, np.float32)
    g[0], g[1], g[-1] = INF, NAN, INF  # two off units, one on
    _, dx = run(lambda t: F.relu(t), x, g)
    want = np.where(x > 0, g, 0).astype(np.float32)
    np.testing.assert_array_equal(dx, want)
    _, plain = run(lambda t: F.relu(t), x, g, rehearse=False)
    assert np.isnan(plain[[0, 1]]).all(), "the control: Paddle's CPU kernel multiplies inf by 0"


def test_relu_layer_in_a_float32_region_leaves_finite_gradients_as_they_were():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
    x = paddle.rand([16, 4])
    model(x).mean().backward()
    plain = [p.grad.numpy().copy() for p in model.parameters()]
    model.clear_gradients()
    with amp.fp16_emulation(model), amp.auto_cast(enable=False):  # nothing rounded, the hook on
        model(x).mean().backward()
    for before, after in zip(plain, [p.grad.numpy() for p in model.parameters()]):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("n", LENGTHS)
def test_gelu_gradient_at_inf_is_nan_as_on_a_gpu(n):
    """The CPU kernel already agrees (gelu_grad_kernel.cu: dout * (cdf + x * pdf), inf * 0)."""
    x = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    x[0], x[-1] = -INF, INF
    y, dx = run(lambda t: F.gelu(t), x, np.ones(n, np.float32))
    assert np.isnan(y[0]) and y[-1] == INF
    assert np.isnan(dx[[0, -1]]).all() and np.isfinite(dx[1:-1]).all()


@pytest.mark.parametrize("n", LENGTHS)
def test_sqrt_of_inf_is_inf_with_a_zero_gradient(n):
    x = np.linspace(0.0, 4.0, n, dtype=np.float32)
    x[0] = INF
    y, dx = run(lambda t: paddle.sqrt(t), x, np.ones(n, np.float32))
    assert y[0] == INF and dx[0] == 0.0
    np.testing.assert_allclose(y[1:], np.sqrt(x[1:]), rtol=1e-6)


def test_outside_a_rehearsal_nothing_changes():
    x = paddle.full([8], float("inf"))
    np.testing.assert_array_equal(F.softmax(x).numpy(), np.full(8, 0.125, np.float32))


@pytest.mark.parametrize("n", LENGTHS)
def test_layer_norm_rows_holding_inf_or_nan_are_nan_as_on_a_gpu(n):
    """The CPU kernel already agrees (LayerNormForward: var = sum(x^2)/n - mean^2, inf - inf)."""
    x = rows(n)
    y, dx = run(lambda t: F.layer_norm(t, [n]), x, np.tile(np.linspace(0.5, 1.5, n, dtype=np.float32), (6, 1)))
    nonfinite_rows = ~np.isfinite(x).all(axis=1)
    assert np.isnan(y[nonfinite_rows]).all() and np.isnan(dx[nonfinite_rows]).all()
    assert np.isfinite(y[~nonfinite_rows]).all() and np.isfinite(dx[~nonfinite_rows]).all()


@pytest.mark.parametrize("n", LENGTHS)
def test_reductions_of_rows_holding_inf_or_nan_follow_ieee_as_on_a_gpu(n):
    x = rows(n)
    with amp.rehearse():
        t = paddle.to_tensor(x)
        sums, means = paddle.sum(t, axis=-1).numpy(), paddle.mean(t, axis=-1).numpy()
        maxes = paddle.max(t, axis=-1).numpy()
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(sums, x.sum(-1), atol=1e-5)  # inf and NaN exactly
        np.testing.assert_allclose(means, x.mean(-1), atol=1e-6)
    assert maxes[0] == INF and maxes[1] == INF and maxes[3] == -INF
