"""fp16/bf16 emulation on the CPU: underflow, overflow, rounding, and a clean exit."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, params_of

import paddle_amp_ext as amp
from paddle_amp_ext.rehearsal import quantize


def underflow_fraction(scale: float) -> float:
    """Fraction of gradient elements non-zero in float32 that fp16 emulation zeroes (loss x 1e-6)."""
    x, y = make_data(seed=0, n=64, inputs=16)

    def grads(emulate: bool) -> np.ndarray:
        model = make_mlp(seed=0, width=32, inputs=16)
        if emulate:
            with amp.fp16_emulation(model):
                (paddle.nn.functional.mse_loss(model(x), y) * 1e-6 * scale).backward()
        else:
            (paddle.nn.functional.mse_loss(model(x), y) * 1e-6).backward()
        return np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])

    live = grads(False) != 0
    return float(((grads(True) == 0) & live).sum() / live.sum())


def test_underflow_without_scaling_and_none_with_it():
    assert underflow_fraction(1.0) >= 0.90
    assert underflow_fraction(2.0**12) == 0.0
    assert underflow_fraction(2.0**16) == 0.0


def test_overflow_is_skipped_and_the_scale_backs_off_until_training_proceeds():
    model = make_mlp(seed=0, width=32)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**40, max_loss_scaling=2.0**48)
    x, y = make_data()
    results = []
    with amp.fp16_emulation(model):
        for _ in range(40):
            scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
            results.append(scaler.step(opt))
            scaler.update()
            opt.clear_grad()
    skipped = [r.skipped for r in results]
    assert skipped[0] is True, "2**40 times the loss overflows fp16 at once"
    first_ok = skipped.index(False)
    assert all(skipped[:first_ok]) and not any(skipped[first_ok:]), "backs off, then trains"
    assert [r.loss_scale for r in results[: first_ok + 1]] == [2.0 ** (40 - i) for i in range(first_ok + 1)]
    assert scaler.loss_scale == 2.0 ** (40 - first_ok) and scaler.skipped_steps == first_ok


def test_bf16_rounding_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(10000) * 10.0 ** rng.integers(-30, 30, 10000),
                             [0.0, -0.0, 1.0, 3.0e38, 1e-40, 1.00390625, 1.01171875]]).astype(np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to nearest even
    reference = rounded.astype(np.uint32).view(np.float32)
    got = quantize(paddle.to_tensor(values), "bfloat16").numpy()
    np.testing.assert_array_equal(got, reference)


def test_fp16_rounding_matches_numpy():
    values = np.array([1e-8, 6e-8, 1e-5, 0.1, 1.0, 65504.0, 65519.0, 65520.0, 1e6, -7e4], dtype=np.float32)
    got = quantize(paddle.to_tensor(values), "float16").numpy()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, values.astype(np.float16).astype(np.float32))


def test_model_after_emulation_equals_one_that_never_entered():
    x, y = make_data()
    visited, untouched = make_mlp(seed=8), make_mlp(seed=8)
    with amp.fp16_emulation(visited) as names:
        assert names == ["0", "2", "4"]
        emulated_out = visited(x)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(visited), params_of(untouched)))
    assert visited.state_dict().keys() == untouched.state_dict().keys()
    np.testing.assert_array_equal(visited(x).numpy(), untouched(x).numpy())
    assert not np.array_equal(emulated_out.numpy(), untouched(x).numpy())
    paddle.nn.functional.mse_loss(visited(x), y).backward()
    paddle.nn.functional.mse_loss(untouched(x), y).backward()
    for a, b in zip(visited.parameters(), untouched.parameters()):
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())


def test_black_list_and_o2_choose_the_emulated_layers():
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.LayerNorm(4), paddle.nn.Softmax())
    with amp.fp16_emulation(model) as names:
        assert names == ["0"]
    with amp.fp16_emulation(model, custom_white_list=["softmax"]) as names:
        assert names == ["0", "2"]
    with amp.fp16_emulation(model, level="O2") as names:
        assert names == ["0"], "O2 with use_promote: the others follow their inputs (and parameters)"
    with amp.fp16_emulation(model, level="O2", use_promote=False) as names:
        assert names == ["0", "1", "2"], "O2 without promotion runs all but Paddle's O2 black list in fp16"
    embedding = paddle.nn.Sequential(paddle.nn.Embedding(10, 4), paddle.nn.Linear(4, 4))
    with amp.fp16_emulation(embedding, level="O2", use_promote=False) as names:
        assert names == ["1"], "lookup_table_v2 is on Paddle's O2 black list"
    with amp.fp16_emulation(model, custom_black_list=["matmul"]) as names:
        assert names == []


def test_scaler_is_on_only_inside_fp16_emulation():
    model = make_mlp()
    scaler = amp.GradScaler()
    with amp.fp16_emulation(model, "bfloat16"):
        loss = model(make_data()[0]).mean()
        assert scaler.scale(loss) is loss, "bfloat16 needs no loss scaling"
    with pytest.raises(ValueError, match="dtype must be one of"):
        with amp.fp16_emulation(model, "float8"):
            pass


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_exact_rounding_path_rounds_values_and_gradients(dtype):
    """The arithmetic path (used where Paddle's cast truncates, e.g. 2.6 on CPU) is exact too."""
    from paddle_amp_ext.rehearsal import rounding

    rng = np.random.default_rng(1)
    values = (rng.standard_normal(5000) * 10.0 ** rng.integers(-12, 6, 5000)).astype(np.float32)
    if dtype == "float16":  # add every kind of tie: midpoints between neighbouring fp16 values
        f16 = rng.standard_normal(3000).astype(np.float16) * np.float16(2.0) ** rng.integers(-24, 15, 3000).astype(np.float16)
        f16 = f16[np.isfinite(f16)]
        upper = np.nextafter(f16, np.float16(np.inf)).astype(np.float64)
        values = np.concatenate([values, ((f16.astype(np.float64) + upper) / 2).astype(np.float32)])
    values = np.concatenate([values, np.array([65519.0, 65520.0, 3e38, -3.4e38, 1e-45, 0.0, 2.0**-25, 2.0**-24 * 1.5],
                                              dtype=np.float32)])
    if dtype == "float16":
        with np.errstate(over="ignore"):
            reference = values.astype(np.float16).astype(np.float32)
    else:
        bits = values.view(np.uint32).astype(np.uint64)
        reference = ((((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(np.float32)
    np.testing.assert_array_equal(rounding.round_exact(paddle.to_tensor(values), dtype).numpy(), reference)
    x = paddle.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
    y = rounding._RoundTrip.apply(x, dtype)
    (y * 1e-40).sum().backward()  # 1e-40 is below fp16's and (as a gradient) rounds in bf16
    expected = rounding.round_exact(paddle.full([3], 1e-40), dtype).numpy()
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    from paddle_amp_ext import _compat

    if _compat.place_kind() == "cpu":  # measured: 3.x CPU casts round to nearest-even, 2.6 truncates
        assert rounding.cast_is_exact(dtype) == paddle.__version__.startswith("3.")
