"""Hostile inputs for the one-pass FP8 block quantization (paddle_amp_ext.fp8.blocks), on both paths."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_amp_ext.fp8.blocks import block_amax, quantize_blocks
from paddle_amp_ext.fp8.formats import quantize

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
