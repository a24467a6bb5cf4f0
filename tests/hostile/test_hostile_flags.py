"""``agree_found_inf`` and ``host_bool`` given flags a hostile caller passes.

A found_inf flag is a bool, an int or float (Python or numpy) or a 1-element paddle.Tensor of
bool, int or float; nonzero is found, NaN included. Anything else is refused before a collective.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
import pytest
from distributed import launch

from paddle_amp_ext.distributed import agree_found_inf, host_bool
from paddle_amp_ext.distributed.flags import checked_flag

SCRIPT = Path(__file__).parent.parent / "dist_scripts" / "flags_hostile.py"
NAN = float("nan")

FOUND = [True, 1, 2, -1, 0.5, NAN, float("inf"), np.float32(NAN), np.int64(3), np.bool_(True),
         lambda: paddle.to_tensor([NAN]), lambda: paddle.to_tensor(0.5), lambda: paddle.to_tensor([True]),
         lambda: paddle.to_tensor([7], dtype="int32"), lambda: paddle.to_tensor([[1]], dtype="int64"),
         lambda: paddle.to_tensor([NAN], dtype="float16")]
CLEAN = [False, 0, 0.0, -0.0, np.float64(0), np.bool_(False), lambda: paddle.to_tensor([False]),
         lambda: paddle.to_tensor(0.0), lambda: paddle.to_tensor([0], dtype="int32")]


def made(flag):
    return flag() if callable(flag) else flag


@pytest.mark.parametrize("flag", FOUND, ids=repr)
def test_nonzero_and_nan_flags_are_found(flag):
    assert host_bool(made(flag)) is True
    assert host_bool(agree_found_inf(made(flag))) is True


@pytest.mark.parametrize("flag", CLEAN, ids=repr)
def test_zero_flags_are_not_found(flag):
    assert host_bool(made(flag)) is False
    assert host_bool(agree_found_inf(made(flag))) is False


def test_a_checked_tensor_flag_is_a_bool_tensor_of_its_shape():
    flag = checked_flag(paddle.to_tensor([NAN, ])[0:1])
    assert flag.dtype == paddle.bool and flag.shape == [1]
    assert checked_flag(paddle.to_tensor(2.0)).shape == []
    same = paddle.to_tensor([True])
    assert checked_flag(same) is same


WRONG_TYPES = ["abc", None, [True], (0,), object(), b"1", {"found": True}, 1 + 2j]


@pytest.mark.parametrize("flag", WRONG_TYPES, ids=repr)
@pytest.mark.parametrize("reader", [agree_found_inf, host_bool], ids=["agree_found_inf", "host_bool"])
def test_a_flag_of_the_wrong_type_is_a_type_error_naming_it_and_the_fix(flag, reader):
    with pytest.raises(TypeError, match=r"A found_inf flag must be a bool, int, float or a 1-element "
                                        r"paddle.Tensor. Received: .+ \(of type \w+\): pass the step's "
                                        r"found_inf: a bool, a number, or a 1-element paddle.Tensor such as "
                                        r"paddle.logical_not\(paddle.isfinite\(norm\)\)"):
        reader(flag)


@pytest.mark.parametrize("shape, elements", [([2], 2), ([0], 0), ([2, 3], 6)])
def test_a_flag_tensor_of_other_than_one_element_is_a_value_error(shape, elements):
    flag = paddle.zeros(shape, dtype="bool")
    message = (rf"A found_inf flag must hold exactly one element. Received a tensor of shape "
               rf"\[{', '.join(map(str, shape))}\] \({elements} elements\): reduce it first \(paddle.any\(flags\)\)")
    with pytest.raises(ValueError, match=message):
        agree_found_inf(flag)
    with pytest.raises(ValueError, match=message):
        host_bool(flag)


def test_a_multi_element_flag_holding_true_is_refused_not_read_as_its_first_element():
    with pytest.raises(ValueError, match=r"shape \[2\] \(2 elements\)"):
        host_bool(paddle.to_tensor([False, True]))


def test_a_flag_tensor_of_a_non_numeric_dtype_is_a_type_error():
    with pytest.raises(TypeError, match=r"A found_inf flag tensor must be bool, int or float. Received a tensor "
                                        r"of dtype paddle.complex64"):
        agree_found_inf(paddle.to_tensor([1 + 0j], dtype="complex64"))


@pytest.mark.slow
def test_odd_flags_on_one_rank_are_found_on_every_rank(tmp_path):
    launch(SCRIPT, str(tmp_path), log_dir=tmp_path / "log", timeout=150)
    agreed = [json.loads((tmp_path / f"rank{r}.json").read_text())["agreed"] for r in (0, 1)]
    assert agreed[0] == agreed[1] == [True, True, True, True, False]
