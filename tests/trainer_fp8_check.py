"""The real Trainer (PaddleFormers on Paddle 3, else PaddleNLP on Paddle 2.6) under ``fp8_linears`` with
``AmpCallback.watch_fp8``: each step's FP8 tags in the callback's hook records, at the hook's step.

Run by tests/test_fp8_tags.py in the toolkit's venv:
    python tests/trainer_fp8_check.py OUTDIR
Prints one JSON line: the hook's records (``fp8/...`` and ``amp/skipped_steps``) and the stats'
``scalars(step)`` of every step (float32 Trainer: the callback's guard sends the steps).
"""

import glob
import importlib.util
import json
import logging
import math
import os
import sys

import paddle

import paddle_amp_ext as amp

TOOLKIT = "paddleformers" if importlib.util.find_spec("paddleformers") else "paddlenlp"
from trainer_callbacks import TokenIds  # noqa: E402
from visualdl import LogReader  # noqa: E402

from paddle_amp_ext.integrations.paddlenlp import AmpCallback  # noqa: E402

trainer_module = __import__(f"{TOOLKIT}.trainer", fromlist=["Trainer"])
OUT = sys.argv[1]
STEPS = 3
logging.getLogger("paddle_amp_ext").setLevel(logging.WARNING)


def model_and_data():
    """A one-layer LLaMA (PaddleFormers) or BERT (PaddleNLP), as tests/trainer_logs_check.py trains."""
    if TOOLKIT == "paddleformers":
        from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                             fuse_rms_norm=False)
        return LlamaForCausalLM(config), TokenIds(), {"save_checkpoint_format": "", "load_checkpoint_format": "",
                                                      "save_to_hf": False}
    from paddlenlp.transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config), TokenIds(classes=2), {}


def read(path):
    reader = LogReader(file_path=path)
    return {tag: [[d.id, None if math.isnan(d.value) else d.value] for d in reader.get_data("scalar", tag)]
            for tag in reader.get_tags()["scalar"] if tag.startswith("fp8/") or tag == "amp/skipped_steps"}


with paddle.utils.unique_name.guard():
    paddle.seed(0)
    model, data, extra = model_and_data()
    args = trainer_module.TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=4, max_steps=STEPS, learning_rate=1e-2, logging_steps=1,
        save_steps=1000, logging_dir=os.path.join(OUT, "vdl"), report_to=[], seed=0, disable_tqdm=True,
        dataloader_drop_last=True, device="cpu", **extra, **({"amp_master_grad": False} if TOOLKIT == "paddleformers" else {}))
    callback = AmpCallback(flush_secs=float("inf"))
    trainer = trainer_module.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    with amp.fp8_linears(model, "blockwise") as stats:
        callback.watch_fp8(stats)
        trainer.train()
    (ours,) = glob.glob(os.path.join(OUT, "vdl", "*", "vdlrecords.*"))
    expected = {step: {tag: None if math.isnan(v) else v for tag, v in stats.scalars(step).items()}
                for step in range(stats.step)}
    print(json.dumps({"toolkit": TOOLKIT, "records": read(ours), "scalars": expected, "stats_steps": stats.step}))
