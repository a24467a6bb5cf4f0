"""Hostile inputs for the one-pass FP8 block quantization (paddle_amp_ext.fp8.blocks), on both paths."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from paddle_amp_ext._native import fp8_kernel
from paddle_amp_ext.fp8.blocks import block_amax, quantize_blocks, quantize_both, quantize_into
from paddle_amp_ext.fp8.formats import fp8_format, quantize

PATHS = [None, False]  # the compiled kernel where it can be had, and numpy


@pytest.mark.parametrize("use_native", PATHS)
def test_wrong_rank_and_scale_shape_are_refused(use_native):
    with pytest.raises(ValueError, match=r"expected a 2-D array. Received shape \[4\]"):
        quantize_blocks(np.ones(4, np.float32), (1, 4), np.ones(1), use_native=use_native)
    with pytest.raises(ValueError, match=r"scales has 1 values; expected 2 x 1 for blocks of \(1, 4\) over shape \[2, 4\]"):
        quantize_blocks(np.ones((2, 4), np.float32), (1, 4), np.ones(1), use_native=use_native)
    with pytest.raises(ValueError, match=r"fmt must be one of 'e4m3fn' or 'e5m2'.*fmt='int8'"):
        quantize_blocks(np.ones((1, 4), np.float32), (1, 4), np.ones(1), "int8", use_native=use_native)


@pytest.mark.parametrize("use_native", PATHS)
def test_non_finite_zero_huge_and_float64_inputs(use_native):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, 3.0]], np.float64)  # float64: converted
    out = quantize_blocks(x, (1, 7), np.ones(1), "e5m2", dequant=False, use_native=use_native)
    assert np.isnan(out.values[0, 0])
    assert out.values[0, 1:].tolist() == [57344.0, -57344.0, 0.0, -0.0, 57344.0, 3.0]
    assert np.signbit(out.values[0, 4])
    assert (out.saturated, out.flushed, out.amax) == (3, 0, float("inf"))
    assert block_amax(np.full((3, 3), np.nan), (2, 2), use_native).tolist() == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("use_native", PATHS)
def test_zero_scale_and_infinite_scale_follow_ieee(use_native):
    x = np.array([[1.0, 0.0]], np.float32)
    zero = quantize_blocks(x, (1, 1), np.array([[0.0, 0.0]]), use_native=use_native)  # 0 * (1/0) = nan
    assert np.isnan(zero.values).tolist() == [[True, True]]
    huge = quantize_blocks(x, (1, 2), np.array([[np.inf]]), dequant=False, use_native=use_native)
    assert huge.values.tolist() == [[448.0, np.nan]] or (huge.values[0, 0] == 448.0 and np.isnan(huge.values[0, 1]))
    assert huge.saturated == 1


@pytest.mark.parametrize("use_native", PATHS)
def test_ragged_blocks_and_strided_input(use_native):
    x = np.arange(1, 26, dtype=np.float32).reshape(5, 5)
    assert block_amax(x.T, (2, 3), use_native).tolist() == [[12.0, 22.0], [14.0, 24.0], [15.0, 25.0]]
    out = quantize_blocks(x.T, (5, 5), np.ones(1), use_native=use_native)  # a transposed view is copied first
    assert out.values.tolist() == quantize(x.T).tolist() and out.amax == 25.0  # 21 -> 20, 25 -> 24 in e4m3


def test_the_input_is_not_modified():
    x = np.array([[1000.0, 0.3]], np.float32)
    quantize_blocks(x, (1, 2), np.ones(1))
    assert x.tolist() == [[1000.0, np.float32(0.3)]]


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("block", [(0, 128), (1, -1), (1.0, 128), (True, 2), (1,), "1x128", None])
def test_bad_blocks_are_refused_by_name(block, use_native):
    with pytest.raises(ValueError, match=r"block must be a \(rows, cols\) tuple of two ints > 0. Received: block="):
        quantize_blocks(np.ones((2, 4), np.float32), block, None, use_native=use_native)
    with pytest.raises(ValueError, match="block must be"):
        block_amax(np.ones((2, 4), np.float32), block, use_native)


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("epsilon", [float("nan"), -1.0, np.float32(-0.5)])
def test_a_nan_or_negative_epsilon_bounds_nothing_on_both_paths(epsilon, use_native):
    """``fmaxf(amax, epsilon)`` of an amax >= 0: NaN and negative epsilons leave the amax (the C
    kernel compares, so it is given 0 for them; before, it turned a NaN epsilon into NaN scales)."""
    x = np.array([[0.5, -3.0, 0.0, 0.0]], np.float32)
    got = quantize_blocks(x, (1, 2), None, epsilon=epsilon, use_native=use_native)
    want = quantize_blocks(x, (1, 2), None, epsilon=0.0, use_native=use_native)
    assert got.scales.tolist() == want.scales.tolist() == [[128.0, 1.0]]  # 448/3 -> 128; a zero block: 1
    assert np.array_equal(got.values, want.values)


@pytest.mark.parametrize("epsilon", ["0", None, True, [0.0]])
def test_an_epsilon_that_is_no_number_is_refused(epsilon):
    with pytest.raises(ValueError, match=r"epsilon must be a number. Received: epsilon="):
        quantize_blocks(np.ones((1, 4), np.float32), (1, 4), None, epsilon=epsilon)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
@pytest.mark.parametrize("use_native", PATHS)
def test_empty_inputs_give_empty_values_and_scales_per_block(shape, use_native):
    out = quantize_blocks(np.ones(shape, np.float32), (1, 128), None, use_native=use_native)
    assert out.values.shape == shape and (out.saturated, out.flushed, out.amax) == (0, 0, 0.0)
    assert out.scales.shape == (shape[0], -(-shape[1] // 128))


def test_quantize_into_writes_in_place_and_matches_the_checked_call():
    from paddle_amp_ext._native import fp8_kernel
    from paddle_amp_ext.fp8.blocks import quantize_into
    from paddle_amp_ext.fp8.formats import E5M2

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((130, 260)) * 1e3).astype(np.float32)
    x[0, 0], x[1, 1] = np.inf, np.nan
    want = quantize_blocks(x, (1, 128), None, "e5m2", epsilon=1e-3, pow2=False)
    for kernel in (fp8_kernel(), None):
        copy = x.copy()
        got = quantize_into(copy, (1, 128), None, E5M2, copy, True, 1e-3, False, kernel)  # dst is src
        assert got.values is copy and np.array_equal(copy, want.values, equal_nan=True)
        assert got[1:4] == want[1:4] and np.array_equal(got.scales, want.scales)


# ---- the emulated fp8_quant_blockwise's quantization (kernels.quant_blocks) ----------------------

def reference_quant(x, one_by_128, epsilon=0.0, pow2=True):
    """The arithmetic kernels.quant_1x128/quant_128x128 computed in numpy before they became
    quant_blocks (ScaleWrapper per block, x * scale in float32, SATFINITE e4m3fn)."""
    from paddle_amp_ext.fp8.blocks import scale_from_amax

    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 128, 128) if one_by_128 else x.reshape(rows // 128, 128, cols // 128, 128)
    axis = 2 if one_by_128 else (1, 3)
    scale = scale_from_amax(np.fmax.reduce(np.abs(blocks), axis=axis, initial=np.float32(0.0)), epsilon, pow2)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scaled = blocks * (scale[:, :, None] if one_by_128 else scale[:, None, :, None])
        return quantize(scaled).reshape(rows, cols), np.float32(1.0) / scale


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("one_by_128", [True, False])
def test_quant_blocks_keeps_the_arithmetic_it_had(one_by_128, use_native, monkeypatch):
    import paddle_amp_ext.fp8.blocks as blocks
    from paddle_amp_ext.fp8.kernels import quant_blocks

    if use_native is False:
        monkeypatch.setattr(blocks, "fp8_kernel", lambda: None)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((256, 384)) * np.exp(rng.uniform(-30, 30, (256, 1)))).astype(np.float32)
    x[0, :128] = 0.0
    x[1, 5], x[2, 7], x[3, 9], x[130, 300] = np.nan, np.inf, -np.inf, 3e38  # NaN ignored; inf: scale 0
    x[4, 200] = 1e-45
    for epsilon, pow2 in ((0.0, True), (1e-4, True), (0.0, False)):
        q, s = quant_blocks(x, one_by_128, epsilon, pow2)
        want_q, want_s = reference_quant(x, one_by_128, epsilon, pow2)
        assert np.array_equal(q, want_q, equal_nan=True) and np.array_equal(np.signbit(q), np.signbit(want_q))
        assert np.array_equal(s, want_s)


def test_quant_blocks_hostile_shapes_and_dtypes():
    from paddle_amp_ext.fp8.kernels import quant_blocks

    q, s = quant_blocks(np.zeros((3, 200)), True)  # float64 zeros, not multiples of 128: partial blocks
    assert q.dtype == np.float32 and not q.any() and s.tolist() == [[1.0, 1.0]] * 3
    q, s = quant_blocks(np.full((130, 130), 3e38, np.float32), False)  # 448/3e38 rounds down to 2**-120
    assert np.all(q == 224.0) and set(s.ravel().tolist()) == {2.0**120}  # 3e38 * 2**-120 = 225.6 -> 224
    q, s = quant_blocks(np.empty((0, 128), np.float32), True)
    assert q.shape == (0, 128) and s.shape == (0, 1)
    # ints converted; the second block: amax 255, scale 448/255 rounds down to 1, 255 -> 256
    assert quant_blocks(np.arange(256, dtype=np.int64).reshape(1, 256), True)[0][0, 255] == 256.0
    with pytest.raises(ValueError, match=r"expected a 2-D array. Received shape \[128\]"):
        quant_blocks(np.ones(128, np.float32), True)


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("shape", [(64, 256), (300, 130), (1, 5), (129, 7), (0, 4), (4, 0)])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_column_blocks_are_the_transposed_row_blocks(shape, fmt, use_native):
    """Blocks of 128 rows x 1 column (the blockwise weight gradient's, along the tokens; the
    compiled kernel's pae_fp8_quant_cols) give the values, scales, counts and amax of the
    transposed array in 1x128 blocks: shapes not multiples of 128, NaN, inf, a subnormal, empty."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-20, 20, shape))).astype(np.float32)
    if x.size > 8:
        x.flat[3], x.flat[7], x.flat[8] = np.nan, -np.inf, 1e-45
    for pow2 in (True, False):
        got = quantize_blocks(x, (128, 1), None, fmt, epsilon=1e-3, pow2=pow2, use_native=use_native)
        want = quantize_blocks(x.T, (1, 128), None, fmt, epsilon=1e-3, pow2=pow2, use_native=use_native)
        assert np.array_equal(got.values.T, want.values, equal_nan=True)
        assert np.array_equal(np.signbit(got.values.T), np.signbit(want.values))
        assert np.array_equal(got.scales.T, want.scales) and got[1:4] == want[1:4]


def test_the_load_probe_refuses_a_column_kernel_that_answers_wrongly():
    from paddle_amp_ext._native import fp8_kernel, probes

    kernel = fp8_kernel()
    if kernel is None:
        pytest.skip("no compiled FP8 kernel here")
    assert probes.wrong_fp8_answer(*kernel) == ""

    def writes_nothing(*args):
        return 0

    def refuses(*args):
        return -1

    assert probes.wrong_fp8_answer(*kernel[:3], writes_nothing, kernel[4]).startswith("columns, format 0: [")
    assert probes.wrong_fp8_answer(*kernel[:3], refuses, kernel[4]) == "columns, format 0: refused"


def test_the_load_probe_refuses_a_two_way_kernel_that_answers_wrongly():
    from paddle_amp_ext._native import fp8_kernel, probes

    kernel = fp8_kernel()
    if kernel is None:
        pytest.skip("no compiled FP8 kernel here")

    def rows_only(src, dst_rows, dst_cols, rows, cols, block, scale_rows, scale_cols, *rest):
        return kernel[2](src, dst_rows, rows, cols, 1, block, scale_rows, *rest[:-1])  # the columns never written

    def swapped(src, dst_rows, dst_cols, *args):
        return kernel[4](src, dst_cols, dst_rows, *args)

    assert probes.wrong_fp8_answer(*kernel[:4], lambda *args: -1) == "both, format 0: refused"
    assert probes.wrong_fp8_answer(*kernel[:4], rows_only).startswith("both, format 0: [")
    assert probes.wrong_fp8_answer(*kernel[:4], swapped).startswith("both, format 0: [")

    def wrong_range(*args):
        done = kernel[4](*args)
        ctypes.c_float.from_address(args[-1]).value = -1.0  # the smallest scale
        return done

    assert probes.wrong_fp8_answer(*kernel[:4], wrong_range).startswith("both, format 0: scale range [-1.0")


@pytest.mark.parametrize("shape", [(1, 1), (3, 129), (130, 5), (257, 300), (128, 128)])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_quantize_both_gives_what_two_quantizations_give(shape, fmt):

    spec = fp8_format(fmt)
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)
    x.flat[:: 7] = 0.0
    x.flat[1:: 11] = np.nan
    x.flat[2:: 13] = -np.inf
    x.flat[3:: 17] = 1e-45
    for kernel in (fp8_kernel(), None):
        rows, cols = np.full_like(x, 7.0), np.full_like(x, 7.0)
        done, scale_range = quantize_both(x, 128, spec, rows, cols, 0.0, True, kernel)
        want = quantize_into(x, (1, 128), None, spec, None, True, 0.0, True, kernel)
        want_cols = quantize_into(x, (128, 1), None, spec, None, True, 0.0, True, kernel)
        assert np.array_equal(rows, want.values, equal_nan=True)
        assert np.array_equal(np.signbit(rows), np.signbit(want.values))
        assert np.array_equal(cols, want_cols.values, equal_nan=True)
        assert np.array_equal(np.signbit(cols), np.signbit(want_cols.values))
        assert np.array_equal(done.scales, want.scales) and done[1:4] == want[1:4]
        assert scale_range == (None if kernel is None else (want.scales.min(), want.scales.max()))


def test_quantize_both_from_threads_gives_each_its_own():

    spec = fp8_format("e4m3fn")
    inputs = [np.random.default_rng(i).standard_normal((200, 150)).astype(np.float32) * (i + 1) for i in range(4)]
    wanted = [(quantize_into(x, (1, 128), None, spec, None, True, 0.0, True, None).values,
               quantize_into(x, (128, 1), None, spec, None, True, 0.0, True, None).values) for x in inputs]
    failures = []

    def work(i):
        for _ in range(20):
            rows, cols = np.empty_like(inputs[i]), np.empty_like(inputs[i])
            quantize_both(inputs[i], 128, spec, rows, cols, 0.0, True, fp8_kernel())
            if not (np.array_equal(rows, wanted[i][0]) and np.array_equal(cols, wanted[i][1])):
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
