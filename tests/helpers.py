"""Small models and data shared by the tests."""

from __future__ import annotations

import os

import numpy as np
import paddle
import pytest


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


def in_another_thread(probe):
    """``probe()`` run in a new thread (while the caller stays inside its contexts); its result."""
    import threading

    result = {}
    thread = threading.Thread(target=lambda: result.update(value=probe()))
    thread.start()
    thread.join(30)
    return result["value"]


def require_native_kernel() -> None:
    """Skip where the one-pass F16C rounding kernel cannot be had; under CI=true (an x86 machine
    with gcc) fail instead, unless PADDLE_AMP_EXT_NATIVE turned it off: the rehearsal's speed
    depends on it there."""
    from paddle_amp_ext._native import status

    current = status()
    if not current.available:
        if os.environ.get("CI") == "true" and not current.detail.startswith("turned off by"):
            pytest.fail(f"the native fp16 kernel is not available under CI: {current}")
        pytest.skip(str(current))


def fp16(values):
    """``values`` as float16 stores them (numpy's conversion), as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)


def bf16(values):
    """``values`` rounded to the nearest bfloat16 (ties to even) on the bit pattern, as float32."""
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), values, nearest)
