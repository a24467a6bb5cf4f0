"""The real PaddleNLP Trainer with paddle_amp_ext routed in, under fp16 rehearsal on a CPU.

Run by tests/test_paddlenlp.py in a venv with paddlenlp (scripts/test builds it):
    python tests/paddlenlp_trainer_check.py OUTDIR
Prints one JSON line: what the Trainer saw, for the test to assert.
"""

import json
import logging
import os
import sys

import numpy as np
import paddle

import paddle_amp_ext as amp

amp.route()  # before paddlenlp.trainer binds paddle.amp.auto_cast and builds its GradScaler
from paddlenlp.trainer import Trainer, TrainingArguments  # noqa: E402
from paddlenlp.transformers import BertConfig, BertForSequenceClassification  # noqa: E402
from trainer_callbacks import Poison, StopAt, TokenIds  # noqa: E402

from paddle_amp_ext.integrations.paddlenlp import AmpCallback  # noqa: E402

OUT = sys.argv[1]
POISON = {2, 5}  # optimizer steps (1-based) whose gradients are made inf
logging.getLogger("paddle_amp_ext").setLevel(logging.WARNING)


def train(output_dir, max_steps, resume=None, stop_at=None):
    with paddle.utils.unique_name.guard():  # the same parameter and optimizer-state names in every run
        return _train(output_dir, max_steps, resume, stop_at)


def _train(output_dir, max_steps, resume, stop_at):
    paddle.seed(0)
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir=output_dir, fp16=True, fp16_opt_level="O1", scale_loss=2.0**10,
                             per_device_train_batch_size=4, max_steps=max_steps, learning_rate=1e-2,
                             lr_scheduler_type="linear", warmup_steps=0, logging_steps=1, save_steps=1000,
                             logging_dir=os.path.join(output_dir, "vdl"), report_to=["visualdl"], seed=0,
                             disable_tqdm=True, dataloader_drop_last=True, device="cpu")
    poison = Poison(model, POISON)
    callbacks = [poison, AmpCallback()] + ([StopAt(stop_at)] if stop_at else [])
    trainer = Trainer(model=model, args=args, train_dataset=TokenIds(classes=2), callbacks=callbacks)
    assert isinstance(trainer.scaler, amp.GradScaler), type(trainer.scaler)
    with amp.fp16_emulation(model):
        trainer.train(resume_from_checkpoint=resume)
    params = {k: v.numpy() for k, v in model.state_dict().items()}
    return trainer, poison.seen, params


whole, seen, params = train(os.path.join(OUT, "whole"), 8)
train(os.path.join(OUT, "half"), 8, stop_at=4)
resumed, seen_resumed, params_resumed = train(os.path.join(OUT, "half"), 8,
                                              resume=os.path.join(OUT, "half", "checkpoint-4"))
print(json.dumps({"seen": seen, "seen_resumed": seen_resumed, "skipped": whole.scaler.skipped_steps,
                  "max_param_diff": max(float(np.abs(params[k] - params_resumed[k]).max()) for k in params),
                  "scale": whole.scaler.loss_scale, "scale_resumed": resumed.scaler.loss_scale,
                  "skipped_resumed": resumed.scaler.skipped_steps, "logging_dir": whole.args.logging_dir}))
