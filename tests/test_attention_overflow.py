"""Overflowing attention logits give NaN, a skipped step and a halved scale at any sequence length.

q.k = 64 x 12.5 x 100 = 80000 > 65504: every logit is +inf in float16. Paddle's CUDA softmax
subtracts the row maximum (inf - inf = NaN); Paddle's CPU softmax returns a uniform row from 8
tokens on, which the rehearsal must not inherit (docs/nonfinite.md).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp

TOKENS = (4, 8, 128)


def attention_model() -> paddle.nn.Layer:
    paddle.seed(0)
    layer = paddle.nn.TransformerEncoderLayer(d_model=64, nhead=1, dim_feedforward=64, dropout=0.0)
    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
        proj.weight.set_value(paddle.zeros_like(proj.weight))
        proj.bias.set_value(paddle.full_like(proj.bias, 100.0))
    return layer


def train(model: paddle.nn.Layer, tokens: int, rehearsal, steps: int = 2):
    """``steps`` AdamW steps under ``rehearsal``; (losses, step results, final scale, params moved)."""
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**10)
    before = [p.numpy().copy() for p in model.parameters()]
    x = paddle.rand([2, tokens, 64])
    losses, results = [], []
    with rehearsal:
        for _ in range(steps):
            with amp.auto_cast():
                loss = model(x).mean()
            scaler.scale(loss).backward()
            results.append(scaler.step(opt))
            scaler.update()
            opt.clear_grad()
            losses.append(float(loss))
    moved = any(not np.array_equal(b, p.numpy()) for b, p in zip(before, model.parameters()))
    return losses, results, scaler.loss_scale, moved


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("entry", ["fp16_emulation", "rehearse"])
def test_overflowing_logits_give_nan_a_skipped_step_and_a_backed_off_scale(tokens, entry, fp16_kernel):
    model = attention_model()
    rehearsal = amp.fp16_emulation(model) if entry == "fp16_emulation" else amp.rehearse()
    losses, results, scale, moved = train(model, tokens, rehearsal)
    assert all(np.isnan(loss) for loss in losses)
    assert [r.skipped for r in results] == [True, True]
    assert [r.loss_scale for r in results] == [2.0**10, 2.0**9] and scale == 2.0**8
    assert not moved, "a skipped step leaves the parameters as they were"


@pytest.mark.parametrize("tokens", TOKENS)
def test_the_attention_output_is_nan_in_every_position(tokens, fp16_kernel):
    model = attention_model()
    with amp.fp16_emulation(model):
        out = model(paddle.rand([2, tokens, 64])).numpy()
    assert np.isnan(out).all()


@pytest.mark.parametrize("tokens", TOKENS)
def test_with_matmul_black_listed_the_same_model_trains(tokens):
    """The control: the logits stay float32, nothing overflows, the steps are taken."""
    model = attention_model()
    losses, results, scale, moved = train(model, tokens, amp.fp16_emulation(model, custom_black_list=["matmul"]))
    assert all(np.isfinite(loss) for loss in losses)
    assert [r.skipped for r in results] == [False, False] and scale == 2.0**10 and moved


def test_a_padding_mask_that_hides_a_whole_row_gives_nan_as_on_a_gpu():
    """A fully masked attention row (every key -inf): CUDA's softmax gives NaN, the CPU's 1/n."""
    paddle.seed(0)
    layer = paddle.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=16, dropout=0.0)
    mask = np.zeros((1, 1, 8, 8), np.float32)
    mask[..., 3, :] = -np.inf  # query 3 may attend to nothing
    x, mask = paddle.rand([1, 8, 16]), paddle.to_tensor(mask)
    assert np.isfinite(layer(x, mask).numpy()).all(), "the control: Paddle's CPU kernel"
    with amp.rehearse():
        out = layer(x, mask).numpy()
    assert np.isnan(out[0, 3]).all() and np.isfinite(np.delete(out[0], 3, axis=0)).all()
