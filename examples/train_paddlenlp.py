"""PaddleNLP's Trainer with paddle_amp_ext: fp16 (rehearsed on a CPU), AMP tags beside the Trainer's logs.

Needs paddlenlp (2.8.1 with Paddle 2.6.2 and the pins in tests/requirements-paddlenlp.txt):
    python examples/train_paddlenlp.py --output-dir runs/nlp --max-steps 8
    python -m paddle_amp_ext.visualdl_serve --logdir runs/nlp/vdl
"""

import argparse
import contextlib

import numpy as np
import paddle

import paddle_amp_ext as amp

amp.route()  # 1. before importing paddlenlp.trainer: its GradScaler and auto_cast are this package's
from paddlenlp.trainer import Trainer, TrainingArguments  # noqa: E402
from paddlenlp.transformers import BertConfig, BertForSequenceClassification  # noqa: E402

from paddle_amp_ext.integrations.paddlenlp import AmpCallback  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", default="runs/nlp")
parser.add_argument("--max-steps", type=int, default=8)
parser.add_argument("--no-rehearse", action="store_true", help="on a GPU: real fp16 instead of the CPU rehearsal")
args = parser.parse_args()


class RandomText(paddle.io.Dataset):
    def __init__(self, n=64):
        rng = np.random.default_rng(0)
        self.ids, self.labels = rng.integers(1, 90, (n, 12)).astype("int64"), rng.integers(0, 2, n).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


paddle.seed(0)
model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32, num_labels=2))
training = TrainingArguments(output_dir=args.output_dir, fp16=True, scale_loss=2.0**10, max_steps=args.max_steps,
                             per_device_train_batch_size=4, logging_steps=1, logging_dir=f"{args.output_dir}/vdl",
                             report_to=["visualdl"], disable_tqdm=True)
trainer = Trainer(model=model, args=training, train_dataset=RandomText(), callbacks=[AmpCallback()])  # 2. the callback
with contextlib.nullcontext() if args.no_rehearse else amp.fp16_emulation(model):
    trainer.train()
print(f"GradScaler: {type(trainer.scaler).__module__}, skipped steps {trainer.scaler.skipped_steps}, "
      f"loss scale {trainer.scaler.loss_scale:g}; logs in {training.logging_dir}")
