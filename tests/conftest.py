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
def caplog_amp(caplog):
    caplog.set_level(logging.DEBUG, logger="paddle_amp_ext")
    return caplog
