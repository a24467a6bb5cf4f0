"""Custom op lists: validated against Paddle's registry, mapped to eager names, visible in the tracer."""

from __future__ import annotations

import contextlib
import io
import logging
import re

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat, oplists


def tracer_lists_inside(**kwargs):
    with amp.auto_cast(**kwargs):
        return _compat.tracer_op_lists()


def test_custom_names_reach_the_tracer_after_alias_mapping():
    white, black = tracer_lists_inside(custom_white_list=["softmax", "add"], custom_black_list=["matmul"])
    assert {"softmax", "add", "elementwise_add"} <= white
    assert {"matmul", "matmul_v2"} <= black
    assert "softmax" not in black and "matmul_v2" not in white


def test_effective_lists_are_paddles_defaults_plus_custom():
    default_white, default_black = _compat.default_op_lists("float16", "O1")
    white, black = tracer_lists_inside(custom_white_list=["relu"])
    assert white == default_white | {"relu"}
    assert black == default_black


def test_tracer_lists_are_restored_after_the_block():
    before = _compat.tracer_op_lists()
    tracer_lists_inside(custom_white_list=["relu"])
    assert _compat.tracer_op_lists() == before


@pytest.mark.parametrize(
    "white, black, message",
    [
        (["softmx"], None, r"Unknown op 'softmx' in custom_white_list\. Did you mean 'softmax'"),
        (None, ["layernorm"], r"Unknown op 'layernorm' in custom_black_list\. Did you mean 'layer_norm'"),
        (["zzzzqqq"], None, r"Unknown op 'zzzzqqq'.*--list-ops"),
        (["softmax"], ["softmax"], r"both custom_white_list and custom_black_list: \['softmax'\]"),
        (["matmul"], ["matmul_v2"], r"both .*\['matmul_v2'\]"),
    ],
)
def test_typos_and_overlaps_are_errors_at_the_call(white, black, message):
    with pytest.raises(ValueError, match=message):
        amp.auto_cast(custom_white_list=white, custom_black_list=black)


@pytest.mark.parametrize("bad", ["softmax", 3, [b"softmax"], [None]])
def test_wrong_types_are_type_errors(bad):
    with pytest.raises(TypeError, match=r"custom_white_list must"):
        amp.auto_cast(custom_white_list=bad)


def test_any_iterable_of_str_is_accepted():
    white, _ = tracer_lists_inside(custom_white_list=(n for n in ["relu", "gelu"]))
    assert {"relu", "gelu"} <= white


def test_names_with_no_effect_are_warned_with_the_reason(caplog_amp):
    with amp.auto_cast(custom_white_list=["conv2d"], custom_black_list=["softmax"]):
        pass
    text = caplog_amp.text
    assert "'conv2d' has no effect: it is already in Paddle's default float16 white list" in text
    assert "'softmax' has no effect: it is already in Paddle's default float16 O1 black list" in text
    caplog_amp.clear()
    with amp.auto_cast(custom_white_list=["relu"], level="O2"):
        pass
    assert "'relu' has no effect at level O2" in caplog_amp.text


def test_alias_mapping_is_logged(caplog_amp):
    with amp.auto_cast(custom_black_list=["matmul"]):
        pass
    records = [r for r in caplog_amp.records if "looked up by eager AMP" in r.getMessage()]
    assert records and records[0].levelno == logging.INFO
    assert "'matmul' is looked up by eager AMP as 'matmul_v2'" in records[0].getMessage()


def test_every_alias_target_is_in_the_installed_registry():
    registry = _compat.ops_this_build_registers() | _compat.ops_in_default_amp_lists()
    missing = {name: t for name, targets in oplists.ALIASES.items() for t in targets if t not in registry}
    assert not missing, f"alias targets unknown to Paddle {paddle.__version__}: {missing}"


# One call per alias: running it under Paddle's operator statistics must record the target.

def _calls():
    a = paddle.rand([4, 4]) + 0.5
    b = paddle.rand([4, 4]) + 0.5
    labels = paddle.to_tensor([[1], [0], [2], [3]], dtype="int64")
    ids = paddle.to_tensor([1, 2], dtype="int64")
    return {
        "matmul": lambda: paddle.matmul(a, b),
        "mm": lambda: paddle.mm(a, b),
        "linear": lambda: paddle.nn.functional.linear(a, b),
        "add": lambda: paddle.add(a, b),
        "subtract": lambda: paddle.subtract(a, b),
        "multiply": lambda: paddle.multiply(a, b),
        "divide": lambda: paddle.divide(a, b),
        "maximum": lambda: paddle.maximum(a, b),
        "minimum": lambda: paddle.minimum(a, b),
        "remainder": lambda: paddle.remainder(a, b),
        "floor_divide": lambda: paddle.floor_divide(a.astype("int64"), b.astype("int64") + 1),
        "sum": lambda: paddle.sum(a),
        "mean": lambda: paddle.mean(a),
        "max": lambda: paddle.max(a),
        "min": lambda: paddle.min(a),
        "prod": lambda: paddle.prod(a),
        "cross_entropy": lambda: paddle.nn.functional.cross_entropy(a, labels),
        "cross_entropy_with_softmax": lambda: paddle.nn.functional.softmax_with_cross_entropy(a, labels),
        "binary_cross_entropy_with_logits": lambda: paddle.nn.functional.binary_cross_entropy_with_logits(a, b / 2),
        "embedding": lambda: paddle.nn.functional.embedding(ids, a),
        "transpose": lambda: paddle.transpose(a, [1, 0]),
        "reshape": lambda: paddle.reshape(a, [2, 8]),
        "flatten": lambda: paddle.flatten(a.reshape([2, 2, 4]), 1),
    }


def recorded_ops(call) -> set:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        with paddle.amp.debugging.collect_operator_stats():
            call()
    return set(re.findall(r"^\s+([a-z0-9_]+)\s+\|", out.getvalue(), flags=re.M))


def test_every_alias_is_what_eager_amp_records():
    calls = _calls()
    assert set(calls) == set(oplists.ALIASES), "each alias needs a call here"
    wrong = {}
    for name, call in calls.items():
        ops = recorded_ops(call)
        # what auto_cast hands to Paddle (the name and its targets) must cover what eager records
        if not ops & set(oplists.expand([name])):
            wrong[name] = sorted(ops)
    assert not wrong, f"eager AMP records other op types on Paddle {paddle.__version__}: {wrong}"
