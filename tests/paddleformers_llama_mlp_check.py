"""PaddleFormers' real LLaMA MLP (and a one-layer LlamaForCausalLM) trained under the rehearsal.

Run by tests/test_llama_mlp.py in a venv with paddleformers 1.2.0 (scripts/test builds it):
    python tests/paddleformers_llama_mlp_check.py OUTDIR
Prints one JSON line: per model, the losses of a few AdamW steps in float32, under
``fp16_emulation`` in float16 (with a GradScaler) and in bfloat16, or the error a run raised.
The config is LLaMA-shaped (hidden 256, intermediate 688, ``fuse_rms_norm=False``: the fused
RMSNorm has no CPU kernel); 64 tokens make each MLP activation 44032 elements, above the
rehearsal's in-place threshold. Nothing is downloaded.
"""

import json
import logging

import numpy as np
import paddle
import rehearsed_training
from paddleformers.nn.mlp import MLP  # what LlamaDecoderLayer builds as its .mlp
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

logging.getLogger("paddle_amp_ext").setLevel(logging.ERROR)
STEPS = 4


def config():
    return LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=688, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, fuse_rms_norm=False)


def mlp_loss(batch):
    x, target = batch
    return lambda model: paddle.nn.functional.mse_loss(model(x), target)


def lm_loss(tokens):
    def loss_of(model):
        out = model(input_ids=tokens, labels=tokens)
        return out[0] if isinstance(out, (tuple, list)) else out.loss
    return loss_of


def train(build, loss_of, dtype):
    with paddle.utils.unique_name.guard():
        paddle.seed(0)
        model = build()
    try:
        return rehearsed_training.train(model, loss_of, dtype, STEPS)
    except Exception as error:  # noqa: BLE001 - reported for the test to show
        return f"{type(error).__name__}: {str(error)[:300]}"


def main():
    rng = np.random.default_rng(0)
    mlp_batch = (paddle.to_tensor(rng.standard_normal((2, 32, 256)).astype(np.float32)),
                 paddle.to_tensor(rng.standard_normal((2, 32, 256)).astype(np.float32)))
    tokens = paddle.to_tensor(rng.integers(1, 128, (2, 32)).astype(np.int64))
    result = {}
    for name, build, loss_of in (("mlp", lambda: MLP(config()), mlp_loss(mlp_batch)),
                                 ("causal_lm", lambda: LlamaForCausalLM(config()), lm_loss(tokens))):
        result[name] = {dtype: train(build, loss_of, dtype) for dtype in ("float32", "float16", "bfloat16")}
    print(json.dumps(result))


main()
