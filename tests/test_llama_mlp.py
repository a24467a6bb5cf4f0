"""A LLaMA-sized SwiGLU MLP trains under the rehearsal (float16 with loss scaling, bfloat16).

The MLP of a LLaMA block (``down(silu(gate(x)) * up(x))``, no biases, 256 -> 688 -> 256, 32
tokens: 22016 elements per activation, above the rehearsal's in-place threshold) behind an RMS
norm, a residual, trained 6 steps by AdamW. Before the in-place rule (silu's output was rounded
in its own buffer, which ``SiluGradNode`` keeps) its first backward raised "(PermissionDenied)
... modified by an inplace operation", on both versions. Paddle's real ``LlamaMLP`` (PaddleFormers
1.2.0) runs in tests/paddleformers_llama_mlp_check.py.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
import rehearsed_training
from helpers import run_trainer_check

HIDDEN, INTERMEDIATE, TOKENS, STEPS = 256, 688, 32, 6


class SwiGLUBlock(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.norm = paddle.nn.LayerNorm(HIDDEN)  # (LLaMA's RMS norm is not an op the rehearsal rounds)
        self.gate_proj = paddle.nn.Linear(HIDDEN, INTERMEDIATE, bias_attr=False)
        self.up_proj = paddle.nn.Linear(HIDDEN, INTERMEDIATE, bias_attr=False)
        self.down_proj = paddle.nn.Linear(INTERMEDIATE, HIDDEN, bias_attr=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down_proj(paddle.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def train(dtype: str) -> list:
    """The losses of STEPS AdamW steps (``"float32"``: the plain loop)."""
    paddle.seed(0)
    model = SwiGLUBlock()
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((4, TOKENS // 4, HIDDEN)).astype(np.float32))
    target = paddle.to_tensor(rng.standard_normal((4, TOKENS // 4, HIDDEN)).astype(np.float32))
    return rehearsed_training.train(model, lambda m: paddle.nn.functional.mse_loss(m(x), target), dtype, STEPS)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_llama_sized_swiglu_mlp_trains_under_the_rehearsal(dtype):
    reference = train("float32")
    losses = train(dtype)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert losses != reference, "the rehearsal rounded nothing"
    # measured: 4e-6 (float16), 1.3e-4 (bfloat16) relative, both versions
    np.testing.assert_allclose(losses, reference, rtol=1e-3)


@pytest.mark.slow
def test_paddleformers_llama_mlp_and_causal_lm_train_under_the_rehearsal(tmp_path):
    """PaddleFormers 1.2.0's own MLP (the one LlamaDecoderLayer builds) and a one-layer
    LlamaForCausalLM, LLaMA-shaped, 4 AdamW steps: float16 and bfloat16 under the rehearsal train
    as float32 does (measured: MLP within 1e-4, the causal LM within 3e-3 relative)."""
    result, _ = run_trainer_check("PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "paddleformers_llama_mlp_check.py", tmp_path)
    for model, rtol in (("mlp", 1e-3), ("causal_lm", 1e-2)):
        runs = result[model]
        reference = runs["float32"]
        for dtype in ("float16", "bfloat16"):
            losses = runs[dtype]
            assert isinstance(losses, list), f"{model} under {dtype}: {losses}"
            assert losses != reference and losses[-1] < losses[0]
            np.testing.assert_allclose(losses, reference, rtol=rtol)
