"""Hostile inputs to op-list validation against every op Paddle defines (paddle_amp_ext._compat.opdefs)."""

from __future__ import annotations

import inspect
import re
import sys
import threading

import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat, oplists
from paddle_amp_ext._compat import opdefs


@pytest.mark.parametrize("name", ["core", "legacy", "name", "__doc__", "__all__", "get_core_ops_args_info"])
def test_attributes_of_the_eager_op_modules_that_are_not_ops_are_unknown(name):
    assert name not in _compat.ops_paddle_defines()
    with pytest.raises(ValueError, match=rf"^Unknown op '{name}' in custom_black_list\."):
        amp.auto_cast(custom_black_list=[name])


@pytest.mark.parametrize("name, hint", [("sync_batch_norm ", "sync_batch_norm"), (" batch_norm", "batch_norm"),
                                        ("sync-batch-norm", "sync_batch_norm")])
def test_near_misses_of_real_names_are_errors_with_the_real_name(name, hint):
    with pytest.raises(ValueError, match=rf"^Unknown op {name!r} in custom_white_list\. Did you mean '{hint}'"):
        oplists.validate([name], [])


@pytest.mark.parametrize("name", ["", "SYNC_BATCH_NORM", "zz_no_such_op_zz"])
def test_empty_and_unknown_names_are_errors(name):
    with pytest.raises(ValueError, match=rf"^Unknown op {name!r} in custom_white_list\."):
        oplists.validate([name], [])


def test_without_paddles_op_compat_map_the_eager_api_still_defines_the_gpu_ops(monkeypatch):
    monkeypatch.setitem(sys.modules, "paddle.incubate.autograd.phi_ops_map", None)  # its import fails
    assert opdefs._op_compat_names() == set()
    import paddle

    assert "sync_batch_norm" in opdefs._eager_api_names(paddle._C_ops), "from sync_batch_norm_"


def test_a_module_missing_or_without_ops_adds_nothing():
    assert opdefs._eager_api_names(None) == set()
    assert opdefs._eager_api_names(object()) == set()


def test_validation_from_many_threads_agrees():
    errors: list[str] = []

    def work():
        for _ in range(20):
            oplists.validate(["sync_batch_norm", "elementwise_add"], ["bilinear_interp_v2"])
            try:
                oplists.validate(["sync_batchnorm"], [])
            except ValueError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 80 and len(set(errors)) == 1


# ---------------------------------------------------------------------- backward op names
@pytest.mark.parametrize("name, forward", [
    ("softmax_grad", "softmax"), ("matmul_v2_grad", "matmul_v2"), ("conv2d_grad_grad", "conv2d"),
    ("tanh_triple_grad", "tanh"), ("sigmoid_double_grad", "sigmoid"), ("embedding_sparse_grad", "embedding"),
    ("linear_grad", "linear"), ("layer_norm_grad", "layer_norm"),
])
@pytest.mark.parametrize("list_name", ["custom_white_list", "custom_black_list"])
def test_a_backward_op_is_refused_naming_its_forward_op(name, forward, list_name):
    lists = {"custom_white_list": [], "custom_black_list": []}
    lists[list_name] = [name]
    with pytest.raises(ValueError, match=rf"^'{name}' in {list_name} is a backward \(gradient\) op: op lists act "
                                         rf"in the forward pass only, .* List the forward op '{forward}' instead\.$"):
        oplists.validate(lists["custom_white_list"], lists["custom_black_list"])
    with pytest.raises(ValueError, match=rf"^'{name}' in {list_name} is a backward"):
        amp.auto_cast(**lists)


def test_no_op_of_paddles_default_lists_nor_an_alias_is_taken_for_a_backward_op():
    known = _compat.ops_paddle_defines()
    defaults = _compat.ops_in_default_amp_lists() | set(oplists.ALIASES)
    assert {name: oplists.forward_op_of(name, known) for name in defaults
            if oplists.forward_op_of(name, known) is not None} == {}
    for name in ("softmax", "grad_add", "fused_linear_param_grad_add", "_grad", "grad", ""):
        assert oplists.forward_op_of(name, known) is None
    assert oplists.forward_op_of("no_such_op_zz_grad", known) is None  # unknown: an unknown-op error instead
    with pytest.raises(ValueError, match=r"^Unknown op 'no_such_op_zz_grad' in custom_white_list\."):
        oplists.validate(["no_such_op_zz_grad"], [])


# ---------------------------------------------------------------------- look-alike characters
@pytest.mark.parametrize("name, escaped, named", [
    ("s\u043eftmax", r"'s\\u043eftmax'", r"\\u043e CYRILLIC SMALL LETTER O at 1"),
    ("\u0455oftmax", r"'\\u0455oftmax'", r"\\u0455 CYRILLIC SMALL LETTER DZE at 0"),
    ("softmax\u200b", r"'softmax\\u200b'", r"\\u200b ZERO WIDTH SPACE at 7"),
])
def test_a_look_alike_name_is_shown_escaped_with_its_code_point_named(name, escaped, named):
    with pytest.raises(ValueError) as info:
        oplists.validate([], [name])
    message = str(info.value)
    assert message.isascii(), message
    assert re.match(rf"^Unknown op {escaped} \(non-ASCII: {named}\) in custom_black_list\. Did you mean 'softmax'",
                    message), message


# ---------------------------------------------------------------------- fused API names
def test_a_fused_api_name_points_to_the_op_it_runs():
    with pytest.raises(ValueError, match=r"^Unknown op 'fused_layer_norm' in custom_white_list: it is the API "
                                         r"paddle\.incubate\.nn\.functional\.fused_layer_norm, not an op type\. "
                                         r"The op it runs is 'fused_bias_residual_layernorm': list that\.$"):
        oplists.validate(["fused_layer_norm"], [])
    oplists.validate(["fused_bias_residual_layernorm"], [])  # which is valid


def test_every_fused_api_that_is_no_op_is_mapped_to_the_op_its_code_runs():
    import paddle.incubate.nn.functional as functional

    defined = _compat.ops_paddle_defines()
    apis = {name for name in dir(functional)
            if name.startswith(("fused_", "cudnn_")) and callable(getattr(functional, name)) and name not in defined}
    mapped = {name for name in apis if _compat.op_of_api(name) is not None}
    assert mapped == apis - {"fused_gate_attention"}, "2.6.2 defines no fused_gate_attention op on a CPU"
    for name in mapped:
        op = _compat.op_of_api(name)
        assert op in defined
        source = inspect.getsource(getattr(functional, name))
        callee = re.search(r"return (\w+)\(", source)
        if callee and hasattr(functional, callee.group(1)):  # fused_linear returns fused_matmul_bias(...)
            source += inspect.getsource(getattr(functional, callee.group(1)))
        assert re.search(rf"C_ops\.{op}_?\(|type=['\"]{op}['\"]", source), (name, op)
    assert _compat.op_of_api("softmax") is None and _compat.op_of_api("") is None


@pytest.mark.parametrize("name", ["_grad" * 20000 + "x", "a_" * 40000 + "_grad", "softmax" + "_grad" * 20000],
                         ids=["grads", "prefixes", "nested"])
def test_a_huge_name_is_judged_at_once(name):
    """No backtracking over a hostile name: a name longer than any op is no backward op (a cap)."""
    assert oplists.forward_op_of(name, _compat.ops_paddle_defines()) is None
    assert oplists.forward_op_of(name[:200], {"softmax"}) in (None, "softmax")
