"""A PaddleOCR-shaped training loop (own code; the shape of PaddleOCR's ``tools/train.py`` and
``tools/program.py``).

What matters for ``python -m paddle_amp_ext.run``: before anything else the process installs a
SIGINT/SIGTERM handler that SIGKILLs its whole process group (PaddleOCR does so where it builds
its data loaders, to take the worker processes down with it); AMP options come from the
``Global`` section (``use_amp``, ``amp_level``, ``amp_dtype``, ``scale_loss``,
``use_dynamic_loss_scaling``, ``amp_custom_black_list``, ``amp_custom_white_list``); the update
is ``scaler.minimize(optimizer, scaled_avg_loss)`` and the loop steps its LR scheduler itself.
PaddleOCR's configs mostly leave the lists empty; this one black-lists ``pool2d``.

    python ocr_style.py --out DIR [--steps N] [--overflow-step K] [--wait-after N] [-o Global.key=value ...]
"""

import argparse
import os
import signal
import sys

import numpy as np
import paddle
import yaml
from paddle.nn import functional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def term_mp(sig_num, frame):
    """Kill the process group (the main process and its data-loader workers)."""
    pid, pgid = os.getpid(), os.getpgid(os.getpid())
    print(f"main proc {pid} exit, kill process group {pgid}", flush=True)
    os.killpg(pgid, signal.SIGKILL)


signal.signal(signal.SIGINT, term_mp)
signal.signal(signal.SIGTERM, term_mp)

CONFIG = """
Global:
  use_amp: True
  amp_level: O1
  amp_dtype: float16
  scale_loss: 1024.0
  use_dynamic_loss_scaling: True
  amp_custom_black_list: ['pool2d']
  amp_custom_white_list: []
Optimizer:
  lr: {name: Cosine, learning_rate: 0.001, warmup_epoch: 0}
"""


class TinyRec(paddle.nn.Layer):
    """Conv-BN-ReLU over a text-line image, pooled over the height: a sequence of class logits."""

    def __init__(self, num_classes=5):
        super().__init__()
        self.conv = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4),
                                         paddle.nn.ReLU(), paddle.nn.MaxPool2D(kernel_size=(2, 1), stride=(2, 1)))
        self.head = paddle.nn.Linear(4, num_classes)

    def forward(self, x):
        feat = self.conv(x).mean(axis=2).transpose([0, 2, 1])  # [N, W, C]
        return self.head(feat)


def rec_loss(preds, batch):
    loss = functional.cross_entropy(preds.reshape([-1, preds.shape[-1]]), batch[1].reshape([-1]))
    return {"loss": loss}


def main():
    parser = argparse.ArgumentParser()
    common.add_common_args(parser)
    parser.add_argument("-o", "--opt", action="append", default=[], help="Global.key=value, the value parsed as YAML")
    args = parser.parse_args()
    config = yaml.safe_load(CONFIG)
    for item in args.opt:
        key, _, value = item.partition("=")
        section, name = key.split(".")
        config[section][name] = yaml.safe_load(value)

    paddle.seed(0)
    model = TinyRec()
    lr_scheduler = paddle.optimizer.lr.CosineAnnealingDecay(config["Optimizer"]["lr"]["learning_rate"], T_max=args.steps)
    optimizer = paddle.optimizer.Adam(learning_rate=lr_scheduler, parameters=model.parameters())

    glob = config["Global"]
    use_amp = glob.get("use_amp", False)
    amp_level = glob.get("amp_level", "O2")
    amp_dtype = glob.get("amp_dtype", "float16")
    amp_custom_black_list = glob.get("amp_custom_black_list", [])
    amp_custom_white_list = glob.get("amp_custom_white_list", [])
    scaler = None
    if use_amp:
        scaler = paddle.amp.GradScaler(init_loss_scaling=glob.get("scale_loss", 1.0),
                                       use_dynamic_loss_scaling=glob.get("use_dynamic_loss_scaling", False))
        if amp_level == "O2":
            model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level=amp_level,
                                                   master_weight=True, dtype=amp_dtype)

    rng = np.random.default_rng(5)
    history, updates = [], 0
    model.train()
    for idx in range(1, args.steps + 1):
        images = paddle.to_tensor(common.inject(common.images(idx, size=8, seed=2), idx, args.overflow_step))
        batch = [images, paddle.to_tensor(rng.integers(0, 5, (2, 8)).astype("int64"))]
        before = common.snapshot(model)
        if use_amp:
            with paddle.amp.auto_cast(level=amp_level, custom_black_list=amp_custom_black_list,
                                      custom_white_list=amp_custom_white_list, dtype=amp_dtype):
                preds = model(batch[0])
            preds = preds.astype("float32")  # PaddleOCR's to_float32: the loss runs outside auto_cast
            loss = rec_loss(preds, batch)
            avg_loss = loss["loss"]
            scaled_avg_loss = scaler.scale(avg_loss)
            scaled_avg_loss.backward()
            scaler.minimize(optimizer, scaled_avg_loss)
        else:
            preds = model(batch[0])
            avg_loss = rec_loss(preds, batch)["loss"]
            avg_loss.backward()
            optimizer.step()
        optimizer.clear_grad()
        if not isinstance(lr_scheduler, float):
            lr_scheduler.step()
        updates += common.changed(before, model)
        history.append(float(avg_loss))
        print(f"epoch: [1/1], global_step: {idx}, lr: {optimizer.get_lr():.6f}, loss: {history[-1]:.6f}", flush=True)
        common.maybe_wait(idx, args.wait_after)
    common.write_report(args.out, model, scaler, history, updates, lr_scheduler)


if __name__ == "__main__":
    main()
