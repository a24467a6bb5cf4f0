"""A few AdamW steps in float32 or under ``fp16_emulation`` (float16 with a GradScaler, bfloat16).

Shared by tests/test_llama_mlp.py and tests/paddleformers_llama_mlp_check.py (run in the
PaddleFormers venv: nothing here imports pytest).
"""

from __future__ import annotations

from typing import Any, Callable, List

import paddle

import paddle_amp_ext as amp


def train(model: paddle.nn.Layer, loss_of: Callable[[paddle.nn.Layer], Any], dtype: str, steps: int) -> List[float]:
    """The losses of ``steps`` AdamW steps (lr 1e-3) of ``model``; ``dtype`` ``"float32"``: the plain loop."""
    optimizer = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=1024.0) if dtype == "float16" else None
    losses = []
    for _ in range(steps):
        if dtype == "float32":
            loss = loss_of(model)
            loss.backward()
            optimizer.step()
        else:
            with amp.fp16_emulation(model, dtype):
                loss = loss_of(model)
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
        optimizer.clear_grad()
        losses.append(float(loss))
    return losses
