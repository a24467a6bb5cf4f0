"""decorate(master_grad=True) on a CUDA GPU (on a CPU Paddle's decorate returns before it).

From reading Paddle 2.6.2 and 3.3.1: at the end of backward the float32 master gradient replaces
``param.grad`` (``core.eager.set_master_grads``); the scaler reads it as any gradient.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat


def test_decorated_master_grads_are_float32_found_clipped_and_guarded():
    if not amp.device.current_decision("float16").enabled:
        pytest.skip("this GPU is below compute capability 7.0: float16 AMP is off")
    paddle.seed(0)
    model = paddle.nn.Linear(16, 16)
    opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    model, opt = amp.decorate(model, opt, level="O2", dtype="float16", master_grad=True)
    scaler = amp.GradScaler(init_loss_scaling=2.0**10)
    x = paddle.randn([8, 16])
    results = []
    for poison in (float("inf"), 1.0):
        before = [p.numpy().copy() for p in model.parameters()]
        with amp.auto_cast(level="O2", dtype="float16"):
            loss = model(x).astype("float32").mean() * poison
        scaler.scale(loss).backward()
        assert all(_compat.grad_of(p).dtype == paddle.float32 for p in model.parameters())
        results.append(scaler.step(opt, grad_clip=1.0))
        scaler.update()
        opt.clear_grad()
        changed = [not np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters())]
        assert any(changed) is (poison == 1.0)
    assert [r.skipped for r in results] == [True, False]
    assert results[1].loss_scale == 2.0**9 and np.isfinite(float(results[1].grad_norm))
