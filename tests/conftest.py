"""Shared fixtures: real Paddle on the CPU, fresh warn-once state, small models."""

from __future__ import annotations

import logging

import numpy as np
import paddle
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


def make_mlp(seed: int = 0, width: int = 16, depth: int = 2, inputs: int = 8, outputs: int = 1):
    paddle.seed(seed)
    layers = []
    size = inputs
    for _ in range(depth):
        layers += [paddle.nn.Linear(size, width), paddle.nn.ReLU()]
        size = width
    layers.append(paddle.nn.Linear(size, outputs))
    return paddle.nn.Sequential(*layers)


def make_data(seed: int = 1, n: int = 32, inputs: int = 8, outputs: int = 1):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal((n, inputs)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((n, outputs)).astype("float32"))
    return x, y


def params_of(model) -> list:
    return [p.numpy().copy() for p in model.parameters()]
