"""The real Trainer (PaddleFormers on Paddle 3, else PaddleNLP on Paddle 2.6) with AmpCallback: the
loss scale, the skipped steps and the grad norm in the Trainer's own ``logs``, as its reporting
callbacks (VisualDL here) write them.

Run by tests/test_dashboards_trainers.py in the toolkit's venv:
    python tests/trainer_logs_check.py OUTDIR
Prints one JSON line: the logs the Trainer's callbacks saw, the Trainer's own VisualDL records
(``train/...``) and the AmpCallback hook's records (``amp/...``; the hook reports to VisualDL and
W&B, whose offline run file is written without W&B installed: its path is printed for the test
to read with W&B's record definitions).
"""

import glob
import importlib.util
import json
import logging
import os
import sys

import paddle

import paddle_amp_ext as amp

amp.route()  # before the toolkit's trainer binds paddle.amp.auto_cast and builds its GradScaler
TOOLKIT = "paddleformers" if importlib.util.find_spec("paddleformers") else "paddlenlp"
trainer_module = importlib.import_module(f"{TOOLKIT}.trainer")
from trainer_callbacks import Poison, TokenIds  # noqa: E402
from visualdl import LogReader  # noqa: E402

from paddle_amp_ext.integrations.paddlenlp import AmpCallback, TrainerCallback  # noqa: E402

OUT = sys.argv[1]
logging.getLogger("paddle_amp_ext").setLevel(logging.WARNING)


class SeenLogs(TrainerCallback):
    """The logs as the first callback sees them (PaddleFormers' reporting callbacks come first)."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append({"step": state.global_step, **{k: logs.get(k) for k in
                                                            ("loss_scale", "skipped_steps", "grad_norm")}})


def model_and_data():
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
    return {tag: [[d.id, d.value] for d in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]}


with paddle.utils.unique_name.guard():
    paddle.seed(0)
    model, data, extra = model_and_data()
    logging_dir = os.path.join(OUT, "vdl")
    args = trainer_module.TrainingArguments(
        output_dir=OUT, fp16=True, fp16_opt_level="O1", scale_loss=2.0**10, per_device_train_batch_size=4,
        max_steps=6, learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=0, logging_steps=2,
        save_steps=1000, logging_dir=logging_dir, report_to=["visualdl"], seed=0, disable_tqdm=True,
        dataloader_drop_last=True, device="cpu", **extra)
    seen = SeenLogs()
    callback = AmpCallback(flush_secs=float("inf"), report_to=["visualdl", "wandb"])
    trainer = trainer_module.Trainer(model=model, args=args, train_dataset=data,
                                     callbacks=[Poison(model, (3,)), callback])
    trainer.callback_handler.callbacks.insert(0, seen)  # first of all: sees what every reporting callback sees
    with amp.fp16_emulation(model):
        trainer.train()
    (ours,) = glob.glob(os.path.join(logging_dir, "*", "vdlrecords.*"))  # the hook's run directory
    own = [f for f in glob.glob(os.path.join(logging_dir, "*vdlrecords.*")) if os.path.dirname(f) == logging_dir]
    print(json.dumps({"toolkit": TOOLKIT, "seen": seen.logs, "trainer_records": read(own[0]),
                      "hook_records": read(ours),
                      "hook_wandb": glob.glob(os.path.join(os.path.dirname(ours), "wandb", "offline-run-*",
                                                           "run-*.wandb")),
                      "order": [type(c).__name__ for c in trainer.callback_handler.callbacks]}))
