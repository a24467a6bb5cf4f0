"""Hostile inputs to op-list validation against every op Paddle defines (paddle_amp_ext._compat.opdefs)."""

from __future__ import annotations

import sys
import threading

import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat, oplists
from paddle_amp_ext._compat import opdefs


@pytest.mark.parametrize("name", ["core", "legacy", "name", "__doc__", "__all__", "get_core_ops_args_info"])
def test_attributes_of_the_eager_op_modules_that_are_not_ops_are_unknown(name):
    assert name not in _compat.defined_op_names()
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
