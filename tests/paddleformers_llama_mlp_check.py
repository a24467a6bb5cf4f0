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
from paddleformers.nn.mlp import MLP  # what LlamaDecoderLayer builds as its .mlp
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

import paddle_amp_ext as amp

logging.getLogger("paddle_amp_ext").setLevel(logging.ERROR)
STEPS = 4


def config():
    return LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=688, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, fuse_rms_norm=False)


def mlp_loss(model, batch):
    x, target = batch
    return paddle.nn.functional.mse_loss(model(x), target)


def lm_loss(model, batch):
    out = model(input_ids=batch, labels=batch)
    return out[0] if isinstance(out, (tuple, list)) else out.loss


def train(build, loss_of, batch, dtype):
    with paddle.utils.unique_name.guard():
        paddle.seed(0)
        model = build()
    optimizer = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=1024.0) if dtype == "float16" else None
    losses = []
    try:
        for _ in range(STEPS):
            if dtype == "float32":
                loss = loss_of(model, batch)
                loss.backward()
                optimizer.step()
            else:
                with amp.fp16_emulation(model, dtype):
                    loss = loss_of(model, batch)
                    if scaler is None:
                        loss.backward()
                        optimizer.step()
                    else:
                        scaler.scale(loss).backward()
                        scaler.step(optimizer)
                        scaler.update()
            optimizer.clear_grad()
            losses.append(float(loss))
    except Exception as error:  # noqa: BLE001 - reported for the test to show
        return f"{type(error).__name__}: {str(error)[:300]}"
    return losses


def main():
    rng = np.random.default_rng(0)
    mlp_batch = (paddle.to_tensor(rng.standard_normal((2, 32, 256)).astype(np.float32)),
                 paddle.to_tensor(rng.standard_normal((2, 32, 256)).astype(np.float32)))
    tokens = paddle.to_tensor(rng.integers(1, 128, (2, 32)).astype(np.int64))
    result = {}
    for name, build, loss_of, batch in (("mlp", lambda: MLP(config()), mlp_loss, mlp_batch),
                                        ("causal_lm", lambda: LlamaForCausalLM(config()), lm_loss, tokens)):
        result[name] = {dtype: train(build, loss_of, batch, dtype) for dtype in ("float32", "float16", "bfloat16")}
    print(json.dumps(result))


main()
