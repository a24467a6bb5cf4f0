"""The real PaddleFormers Trainer with paddle_amp_ext routed in, on a CPU: fp16 (rehearsed) and bf16.

Run by tests/test_paddleformers.py in a venv with paddleformers (scripts/test builds it):
    python tests/paddleformers_trainer_check.py OUTDIR
Prints one JSON line: what the Trainer saw, for the test to assert. A tiny Llama built from a
config (``fuse_rms_norm=False``: the fused RMSNorm has no CPU kernel) and random token ids;
nothing is downloaded. Every run keeps PaddleFormers' default ``amp_master_grad=True``, so the
gradients live in ``param.main_grad``. Checkpoints are in the single-process format (the default
``flex_checkpoint`` loads only with fleet's hybrid communicate group initialised, and the legacy loader
reads Paddle weights, not the safetensors of ``save_to_hf``).
"""

import json
import logging
import os
import sys

import numpy as np
import paddle

import paddle_amp_ext as amp

amp.route()  # before paddleformers.trainer binds paddle.amp.auto_cast and builds its GradScaler
from paddleformers.trainer import Trainer, TrainingArguments  # noqa: E402
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from trainer_callbacks import Poison, StopAt, TokenIds  # noqa: E402

from paddle_amp_ext.integrations.paddleformers import AmpCallback  # noqa: E402

OUT = sys.argv[1]
logging.getLogger("paddle_amp_ext").setLevel(logging.WARNING)


def train(output_dir, max_steps, dtype="float16", poison=(2, 5), value=float("inf"), resume=None, stop_at=None,
          callback=None):
    with paddle.utils.unique_name.guard():  # the same parameter and optimizer-state names in every run
        paddle.seed(0)
        config = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                             fuse_rms_norm=False)
        model = LlamaForCausalLM(config)
        args = TrainingArguments(output_dir=output_dir, fp16=dtype == "float16", bf16=dtype == "bfloat16",
                                 fp16_opt_level="O1", scale_loss=2.0**10, per_device_train_batch_size=4,
                                 max_steps=max_steps, learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=0,
                                 logging_steps=1, save_steps=1000, logging_dir=os.path.join(output_dir, "vdl"),
                                 report_to=["visualdl"], seed=0, disable_tqdm=True, dataloader_drop_last=True,
                                 device="cpu", save_checkpoint_format="", load_checkpoint_format="", save_to_hf=False)
        assert args.amp_master_grad, "PaddleFormers' default"
        poisoner = Poison(model, poison, value)
        callback = AmpCallback() if callback is None else callback  # False: no AmpCallback, routing alone
        callbacks = [poisoner] + ([callback] if callback else []) + ([StopAt(stop_at)] if stop_at else [])
        trainer = Trainer(model=model, args=args, train_dataset=TokenIds(), callbacks=callbacks)
        assert isinstance(trainer.scaler, amp.GradScaler), type(trainer.scaler)
        with amp.fp16_emulation(model, dtype=dtype):
            trainer.train(resume_from_checkpoint=resume)
        params = {k: v.numpy() for k, v in model.state_dict().items()}
        return trainer, poisoner, params, callback


def max_diff(a, b):
    return max(float(np.abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in a)


whole, poisoned, params, _ = train(os.path.join(OUT, "whole"), 8)
train(os.path.join(OUT, "half"), 8, stop_at=4)
resumed, poisoned_resumed, params_resumed, _ = train(os.path.join(OUT, "half"), 8,
                                                     resume=os.path.join(OUT, "half", "checkpoint-4"))
_, bf16_poison, bf16_params, bf16_callback = train(os.path.join(OUT, "bf16"), 4, "bfloat16", (2,), float("nan"))
with amp.routed() as routing:  # routing alone (amp.route() or `run`), no AmpCallback: the routing's guard
    alone, alone_poison, alone_params, _ = train(os.path.join(OUT, "bf16-routed"), 4, "bfloat16", (2,), float("nan"),
                                                 callback=False)
    (alone_guard,) = [g for g in routing.guards if g.optimizer is alone.optimizer]
    alone_held = routing.lr_steps_held
try:  # the control: without the guard the NaN reaches the weights, and the Trainer stops at the next loss
    with amp.routed(guard_optimizers=False):
        train(os.path.join(OUT, "bf16-unguarded"), 4, "bfloat16", (2,), float("nan"), callback=AmpCallback(guard=False))
    unguarded = "trained"
except ValueError as exc:
    unguarded = str(exc)
guard = bf16_callback.optimizer_guard
print(json.dumps({
    "fp16": {"seen": poisoned.seen, "seen_resumed": poisoned_resumed.seen, "poisoned": poisoned.poisoned,
             "skipped": whole.scaler.skipped_steps, "scale": whole.scaler.loss_scale,
             "skipped_resumed": resumed.scaler.skipped_steps, "scale_resumed": resumed.scaler.loss_scale,
             "max_param_diff": max_diff(params, params_resumed),
             "finite": bool(all(np.isfinite(v).all() for v in params.values())),
             "logging_dir": whole.args.logging_dir},
    "bf16": {"poisoned": bf16_poison.poisoned, "guard_skipped": guard.skipped_steps, "guard_active": guard.active,
             "finite": bool(all(np.isfinite(v.astype("float32")).all() for v in bf16_params.values())),
             "unguarded": unguarded,
             "seen": bf16_poison.seen, "logging_dir": os.path.join(OUT, "bf16", "vdl")},
    "bf16_routed": {"poisoned": alone_poison.poisoned, "guard_skipped": alone_guard.skipped_steps,
                    "finite": bool(all(np.isfinite(v.astype("float32")).all() for v in alone_params.values())),
                    "seen": alone_poison.seen, "lr_steps_held": alone_held,
                    "global_step": alone.state.global_step},
}))
