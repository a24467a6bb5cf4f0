"""Hostile inputs to the FP8 rounding: wrong formats, wrong dtypes, empty and odd shapes."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_amp_ext.fp8.formats import fp8_format, quantize


@pytest.mark.parametrize("fmt", ["e4m4", "", None, 8, "float16"])
def test_unknown_format_names_the_value(fmt):
    with pytest.raises(ValueError, match=r"fmt must be one of 'e4m3fn' or 'e5m2'.*Received: fmt="):
        fp8_format(fmt)


def test_empty_and_scalar_and_odd_shapes():
    assert quantize(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert quantize(np.float32(500.0)).tolist() == 448.0
    assert quantize(np.full((3, 5, 7), -1000.0)).min() == -448.0


def test_other_dtypes_are_converted_to_float32_first():
    assert quantize(np.array([300, -70000], np.int64), "e5m2").tolist() == [320.0, -57344.0]
    assert quantize(np.array([1e300], np.float64)).tolist() == [448.0]  # float64 1e300 -> float32 inf -> 448


def test_non_contiguous_view():
    x = np.arange(20, dtype=np.float32).reshape(4, 5).T * 37.0
    assert quantize(x).tolist() == quantize(np.ascontiguousarray(x)).tolist()


def test_string_input_is_rejected():
    with pytest.raises(ValueError):
        quantize(np.array(["a"]))
