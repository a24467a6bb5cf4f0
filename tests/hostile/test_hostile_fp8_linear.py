"""Hostile inputs to fp8_linears and its stats: non-finite values, zeros, empty batches, odd
shapes, wrong recipe types, threads."""

from __future__ import annotations

import threading

import numpy as np
import paddle
import pytest

from paddle_amp_ext.fp8.linear import Fp8Recipe, fp8_linears
from paddle_amp_ext.fp8.stats import Fp8Stats


def lin(k=5, n=3):
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(k, n))


@pytest.mark.parametrize("recipe", ["blockwise", "current", "delayed"])
def test_non_finite_inputs_propagate_and_are_counted(recipe):
    model = lin()
    x = paddle.to_tensor([[1.0, np.inf, 2.0, 3.0, np.nan]])
    with fp8_linears(model, recipe) as stats:
        y = model(x)
    assert np.isnan(y.numpy()).all()  # inf times 0-scale or NaN: the GPU's arithmetic gives NaN too
    record = next(r for r in stats.records if r.role == "input")
    # inf sets the amax: scale 448/inf = 0 (NaN after, nothing clipped); delayed starts at scale 1: inf clips
    assert record.saturated == {"blockwise": 0.0, "current": 0.0, "delayed": 0.2}[recipe]


@pytest.mark.parametrize("recipe", ["blockwise", "current", "delayed"])
def test_zeros_and_empty_batches(recipe):
    model = lin()
    with fp8_linears(model, recipe) as stats:
        y = model(paddle.zeros([4, 5]))
        empty = model(paddle.zeros([0, 5]))
    assert np.array_equal(y.numpy(), np.broadcast_to(model[0].bias.numpy(), (4, 3)))
    assert list(empty.shape) == [0, 3]
    assert all(r.flushed == 0.0 and r.saturated == 0.0 for r in stats.records)


def test_three_dimensional_inputs_and_huge_amax():
    model = lin(130, 2)
    x = paddle.full([2, 3, 130], 3e38)
    with fp8_linears(model, "blockwise") as stats:
        y = model(x)
    assert list(y.shape) == [2, 3, 2]
    record = next(r for r in stats.records if r.role == "input")
    assert (record.amax, record.saturated, record.scale_min) == (np.float32(3e38), 0.0, 2.0**-120)


def test_wrong_recipe_types():
    with pytest.raises(TypeError, match="recipe must be an Fp8Recipe"):
        with fp8_linears(lin(), recipe=None):
            pass
    with pytest.raises(ValueError, match="scaling must be one of"):
        with fp8_linears(lin(), recipe="mxfp8"):
            pass


def test_threads_append_to_one_stats():
    stats = Fp8Stats()
    models = [lin() for _ in range(4)]

    def work(model):
        with fp8_linears(model, "current", stats=stats):
            model(paddle.ones([2, 5]))

    threads = [threading.Thread(target=work, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stats.records) == 8  # input and weight of each model's one linear


def test_a_model_without_linears_is_left_alone():
    model = paddle.nn.Sequential(paddle.nn.ReLU())
    with fp8_linears(model) as stats:
        model(paddle.ones([2]))
    assert stats.records == [] and stats.summary() == [] and stats.scalars() == {} and stats.worst() is None


def test_record_off_keeps_the_stats_empty_and_the_results_equal():
    model = lin(130, 4)
    x = paddle.randn([3, 130])
    with fp8_linears(model, "blockwise") as recorded:
        a = model(x)
    with fp8_linears(model, "blockwise", record=False) as silent:
        b = model(x)
    assert recorded.records and silent.records == []
    assert np.array_equal(a.numpy(), b.numpy())
    with pytest.raises(TypeError, match="record must be True or False. Received: record='no'"):
        with fp8_linears(model, record="no"):
            pass


@pytest.mark.parametrize("recipe", ["blockwise", "current", "delayed"])
def test_an_empty_batch_trains_backward_to_zero_gradients(recipe):
    model = paddle.nn.Linear(4, 3)
    x = paddle.zeros([0, 4])
    x.stop_gradient = False
    with fp8_linears(model, recipe):  # no .sum(): Paddle 2.6 refuses to reduce an empty tensor
        paddle.autograd.backward([model(x)], [paddle.ones([0, 3])])
    assert x.grad is None or list(x.grad.shape) == [0, 4]  # Paddle 2.6 leaves an empty input's gradient None
    assert model.weight.grad.numpy().tolist() == [[0.0] * 3] * 4


def _grads_of_two_kept_graphs(recipe, copy, monkeypatch):
    import paddle_amp_ext.fp8._buffers as buffers

    monkeypatch.setattr(buffers, "VIEW_FROM", 1 << 40 if copy else 1)
    paddle.seed(4)
    model = paddle.nn.Sequential(paddle.nn.Linear(200, 130), paddle.nn.ReLU(), paddle.nn.Linear(130, 7))
    xs = [paddle.randn([33, 200]) * 10.0 ** k for k in (0, 3)]
    with fp8_linears(model, recipe):
        ys = [model(x) for x in xs]  # the second forward runs while the first's graph holds its operands
        ys[1].mean().backward()  # the later graph first
        ys[0].sum().backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        model.clear_gradients()
        model(xs[0]).sum().backward()  # the pool's tensors free again: reused
        again = [p.grad.numpy().copy() for p in model.parameters()]
    return [y.numpy() for y in ys], grads, again


@pytest.mark.parametrize("recipe", ["blockwise", "current", "delayed"])
def test_reused_tensors_never_change_a_graph_still_held(recipe, monkeypatch):
    """The layers reuse their quantized operands' tensors only when nothing else holds them: two
    forwards before their backwards (run in the other order) give the results of the path that
    allocates (and copies) everything. (A retained graph run twice is not tried: Paddle 3.3.1's
    PyLayer node crashes on the second backward, with or without FP8.)"""
    pooled = _grads_of_two_kept_graphs(recipe, False, monkeypatch)
    copied = _grads_of_two_kept_graphs(recipe, True, monkeypatch)
    for a, b in zip(pooled, copied):
        for u, v in zip(a, b):
            assert np.array_equal(u, v)


def test_gradients_not_asked_for_are_not_computed():
    model = lin(5, 3)
    model[0].weight.stop_gradient = True
    x = paddle.ones([2, 5])
    x.stop_gradient = False
    with fp8_linears(model, "blockwise"):
        model(x).sum().backward()
    assert model[0].weight.grad is None and list(x.grad.shape) == [2, 5]
    assert model[0].bias.grad.numpy().tolist() == [2.0, 2.0, 2.0]


def test_threads_share_one_layer_without_mixing_their_buffers():
    model = lin(200, 130)
    xs = [paddle.randn([17, 200]) * (i + 1) for i in range(4)]
    with fp8_linears(model, "current", record=False):
        want = [model(x).numpy() for x in xs]
        got = [None] * 4

        def work(i):
            for _ in range(20):
                got[i] = model(xs[i]).numpy()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for a, b in zip(got, want):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("scales, low, high", [
    (np.array([2.0], np.float32), 2.0, 2.0),
    (np.array([[np.inf]], np.float32), None, None),
    (np.array([np.nan], np.float32), None, None),
    (np.array([4.0, np.inf, 0.5, np.nan], np.float32), 0.5, 4.0),
    (np.array([-np.inf, 3.0], np.float32), 3.0, 3.0),
    (np.zeros((0, 0), np.float32), None, None),
    (np.full((2, 3), 8.0, np.float32), 8.0, 8.0),
])
def test_add_counts_keeps_the_finite_scales_range(scales, low, high):
    stats = Fp8Stats()
    stats.add_counts("0", "input", "e4m3fn", 1, 0, 4, 3.0, scales)
    record = stats.records[-1]
    if low is None:
        assert np.isnan(record.scale_min) and np.isnan(record.scale_max)
    else:
        assert (record.scale_min, record.scale_max) == (low, high)
    assert (record.saturated, record.amax) == (0.25, 3.0)


@pytest.mark.parametrize("recipe", ["blockwise", "current"])
@pytest.mark.parametrize("batch", [(37,), (3, 5), (0,)])
def test_a_nonzero_bias_is_added_and_its_gradient_summed_exactly(recipe, batch):
    """The bias is added in float32 into the GEMM's output (in place, through a view) and its
    gradient is the output gradient summed over the tokens: exact with FP8-exact values, for a
    2-D, a 3-D and an empty input; a bias with stop_gradient gets no gradient."""

    rng = np.random.default_rng(1)
    lin = paddle.nn.Linear(200, 130)
    lin.weight.set_value(rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], lin.weight.shape).astype(np.float32))
    lin.bias.set_value(rng.choice([-3.0, 0.25, 7.5], lin.bias.shape).astype(np.float32))
    x = paddle.to_tensor(rng.integers(-2, 3, (*batch, 200)).astype(np.float32))
    dy = paddle.to_tensor(rng.choice([-1.0, 2.0, 0.5], (*batch, 130)).astype(np.float32))
    want = x.numpy().reshape(-1, 200) @ lin.weight.numpy() + lin.bias.numpy()
    with fp8_linears(lin, Fp8Recipe(recipe, pow2=True)):
        y = lin(x)
        if not x.size:  # Paddle 2.6 reduces no empty tensor: the forward only
            assert y.shape == [*batch, 130]
            return
        (y * dy).sum().backward()
    assert y.shape == [*batch, 130]
    assert np.array_equal(y.numpy().reshape(-1, 130), want.astype(np.float32))
    assert np.array_equal(lin.bias.grad.numpy(), dy.numpy().reshape(-1, 130).sum(axis=0))
    lin.clear_gradients()
    lin.bias.stop_gradient = True
    with fp8_linears(lin, recipe):
        lin(x).sum().backward()
    assert lin.bias.grad is None or not lin.bias.grad.numpy().any()  # cleared (to zeros), nothing added
    assert lin.weight.grad is not None


def test_blockwise_without_the_kernel_gives_the_kernels_values(monkeypatch):
    """Without the compiled kernel (numpy rounds), the blockwise step quantizes an input and an
    output gradient along rows and columns in two calls, to the same values, gradients and stats."""
    import paddle_amp_ext.fp8.linear as linear_module

    def run():
        paddle.seed(3)
        model = paddle.nn.Sequential(paddle.nn.Linear(130, 257), paddle.nn.ReLU(), paddle.nn.Linear(257, 3))
        x = paddle.randn([131, 130]) * 5
        with fp8_linears(model, "blockwise") as stats:
            y = model(x)
            y.sum().backward()
        return [y.numpy(), *(p.grad.numpy() for p in model.parameters())], stats.records

    with_kernel, records = run()
    monkeypatch.setattr(linear_module, "fp8_kernel", lambda: None)
    without, numpy_records = run()
    assert all(np.array_equal(a, b) for a, b in zip(with_kernel, without))
    assert records == numpy_records
