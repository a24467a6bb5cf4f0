"""GPU-only tests: marked `gpu` and skipped at run time where Paddle sees no CUDA GPU."""

from __future__ import annotations

import paddle
import pytest


def _gpu_reason() -> str | None:
    if not paddle.device.is_compiled_with_cuda():
        return "needs a CUDA GPU: Paddle is a CPU build"
    if paddle.device.cuda.device_count() == 0:
        return "needs a CUDA GPU: none is visible"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
