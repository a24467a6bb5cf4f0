"""A PaddleDetection-shaped Trainer (own code; the shape of PaddleDetection 2.6's ``ppdet.engine.Trainer``).

What matters for ``python -m paddle_amp_ext.run``: AMP options come from YAML-ish config keys
(``amp``, ``amp_level``, ``init_loss_scaling``, ``custom_white_list``, ``custom_black_list``),
the scaler and ``auto_cast`` are enabled only when the config says ``use_gpu`` (or ``use_npu``,
``use_mlu``: PaddleDetection turns AMP off on a CPU itself), the step is ``scaler.minimize(optimizer, scaled_loss)``, and the
trainer steps its own warmup + piecewise LR scheduler after every iteration.

    python det_style.py --out DIR [--steps N] [--overflow-step K] [-o key=value ...]
"""

import argparse
import os
import sys

import numpy as np
import paddle
import yaml
from paddle.nn import functional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CONFIG = """
use_gpu: false
use_npu: false
use_mlu: false
amp: true
amp_level: O1
init_loss_scaling: 1024
custom_white_list: ~
custom_black_list: ['reduce_mean']
LearningRate:
  base_lr: 0.01
  milestones: [4]
  gamma: 0.1
  warmup_steps: 3
  warmup_start_factor: 0.1
"""


class TinyDetector(paddle.nn.Layer):
    """A conv backbone and a head predicting one box (4 numbers) and class logits per image."""

    def __init__(self, num_classes=2):
        super().__init__()
        self.backbone = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4),
                                             paddle.nn.ReLU(), paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten())
        self.bbox_head = paddle.nn.Linear(4, 4)
        self.cls_head = paddle.nn.Linear(4, num_classes)

    def forward(self, inputs):
        feat = self.backbone(inputs["image"])
        loss_bbox = functional.smooth_l1_loss(self.bbox_head(feat), inputs["gt_bbox"])
        loss_cls = functional.cross_entropy(self.cls_head(feat), inputs["gt_class"]).mean()
        return {"loss": loss_bbox + loss_cls, "loss_bbox": loss_bbox, "loss_cls": loss_cls}


class Trainer:
    def __init__(self, cfg, steps):
        self.cfg = cfg
        paddle.seed(0)
        self.model = TinyDetector()
        lr_cfg = cfg["LearningRate"]
        base = lr_cfg["base_lr"]
        piecewise = paddle.optimizer.lr.PiecewiseDecay(
            boundaries=lr_cfg["milestones"], values=[base * lr_cfg["gamma"] ** i for i in range(len(lr_cfg["milestones"]) + 1)])
        self.lr = paddle.optimizer.lr.LinearWarmup(piecewise, warmup_steps=lr_cfg["warmup_steps"],
                                                   start_lr=base * lr_cfg["warmup_start_factor"], end_lr=base)
        self.optimizer = paddle.optimizer.Momentum(learning_rate=self.lr, momentum=0.9,
                                                   parameters=self.model.parameters(),
                                                   weight_decay=paddle.regularizer.L2Decay(1e-4))
        self.use_amp = cfg.get("amp", False)
        self.amp_level = cfg.get("amp_level", "O1")
        self.custom_white_list = cfg.get("custom_white_list", None)
        self.custom_black_list = cfg.get("custom_black_list", None)
        self.steps = steps
        self.status = {}

    def on_device(self):
        """PaddleDetection enables AMP only on these devices (so never on a CPU)."""
        return self.cfg["use_gpu"] or self.cfg["use_npu"] or self.cfg["use_mlu"]

    def train(self, overflow_step=0, wait_after=0):
        model = self.model
        scaler = None
        if self.use_amp:
            scaler = paddle.amp.GradScaler(enable=self.on_device(),
                                           init_loss_scaling=self.cfg.get("init_loss_scaling", 1024))
        rng = np.random.default_rng(3)
        history, updates = [], 0
        model.train()
        for step_id in range(1, self.steps + 1):
            data = {"image": paddle.to_tensor(common.inject(common.images(step_id, seed=1), step_id, overflow_step)),
                    "gt_bbox": paddle.to_tensor(rng.random((2, 4)).astype("float32")),
                    "gt_class": paddle.to_tensor(rng.integers(0, 2, (2,)).astype("int64"))}
            before = common.snapshot(model)
            if self.use_amp:
                with paddle.amp.auto_cast(enable=self.on_device(), custom_white_list=self.custom_white_list,
                                          custom_black_list=self.custom_black_list, level=self.amp_level):
                    outputs = model(data)
                    loss = outputs["loss"]
                scaled_loss = scaler.scale(loss)
                scaled_loss.backward()
                scaler.minimize(self.optimizer, scaled_loss)
            else:
                outputs = model(data)
                loss = outputs["loss"]
                loss.backward()
                self.optimizer.step()
            curr_lr = self.optimizer.get_lr()
            self.lr.step()
            self.optimizer.clear_grad()
            self.status["learning_rate"] = curr_lr
            updates += common.changed(before, model)
            history.append(float(loss))
            print(f"Epoch: [0] [{step_id}/{self.steps}] learning_rate: {curr_lr:.6f} loss: {history[-1]:.6f}",
                  flush=True)
            common.maybe_wait(step_id, wait_after)
        return scaler, history, updates


def main():
    parser = argparse.ArgumentParser()
    common.add_common_args(parser)
    parser.add_argument("-o", "--opt", action="append", default=[], help="key=value, the value parsed as YAML")
    args = parser.parse_args()
    cfg = yaml.safe_load(CONFIG)
    for item in args.opt:
        key, _, value = item.partition("=")
        cfg[key] = yaml.safe_load(value)
    trainer = Trainer(cfg, args.steps)
    scaler, history, updates = trainer.train(args.overflow_step, args.wait_after)
    common.write_report(args.out, trainer.model, scaler, history, updates, trainer.lr,
                        scaler_enabled=bool(scaler.is_enable()) if scaler is not None else None)


if __name__ == "__main__":
    main()
