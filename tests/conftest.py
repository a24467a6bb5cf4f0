"""Shared fixtures: fresh warn-once state and decision cache, package log capture."""

from __future__ import annotations

import logging

import pytest

from paddle_amp_ext import _log
from paddle_amp_ext.device import current_decision


@pytest.fixture(autouse=True)
def fresh_state():
    _log.reset_once()
    current_decision.cache_clear()
    from paddle_amp_ext import _compat

    before = _compat.amp_state_dtype()
    yield
    _compat.set_amp_state_dtype(before)


@pytest.fixture
def rebuild(monkeypatch, tmp_path):
    """A fresh native-kernel build state with the cache in ``tmp_path / "cache"``; the real
    kernel is loaded again after."""
    from paddle_amp_ext._native import build

    monkeypatch.setenv(build.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(build.ENV_SWITCH, raising=False)
    build.reset()
    yield tmp_path / "cache"
    monkeypatch.undo()
    build.reset()


@pytest.fixture
def caplog_amp(caplog):
    caplog.set_level(logging.DEBUG, logger="paddle_amp_ext")
    return caplog


@pytest.fixture(params=["native", "arithmetic"])
def fp16_kernel(request, monkeypatch):
    """Run the test with each kind of rounding kernel: the compiled one-pass kernels (F16C for
    float16, integer for bfloat16), and Paddle's kernels (the fallback where they cannot be
    built: thirteen float32 kernels for float16; the cast pair or float32 arithmetic for bfloat16)."""
    from helpers import require_native_kernel

    from paddle_amp_ext._compat import kernels

    if request.param == "native":
        require_native_kernel()
    else:
        monkeypatch.setattr(kernels, "fp16_rounder", lambda: None)
        monkeypatch.setattr(kernels, "bf16_rounder", lambda: None)
    return request.param
