"""A PaddleSeg-shaped train loop (own code; the shape of PaddleSeg 2.8.0's ``paddleseg.core.train``).

What matters for ``python -m paddle_amp_ext.run``: the AMP lists are hard-coded in the loop
(``custom_white_list={"elementwise_add", "batch_norm", "sync_batch_norm"}``,
``custom_black_list={"bilinear_interp_v2"}``; ``sync_batch_norm`` has GPU kernels only), the
update is ``scaler.minimize(optimizer, scaled)``, and the loop steps the optimizer's own LR
scheduler after every iteration, whatever the scaler did.

    python seg_style.py --out DIR [--steps N] [--overflow-step K] [--wait-after N]

(PaddleSeg's ``precision='fp16'`` at its default ``amp_level='O1'``.)
"""

import argparse
import os
import sys

import numpy as np
import paddle
from paddle.nn import functional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class TinySegNet(paddle.nn.Layer):
    """Conv-BN-ReLU, a residual add, a 1x1 classifier at half resolution, bilinear upsampling."""

    def __init__(self, num_classes=3):
        super().__init__()
        self.stem = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4),
                                         paddle.nn.ReLU())
        self.down = paddle.nn.Conv2D(4, 4, 3, stride=2, padding=1)
        self.bn = paddle.nn.BatchNorm2D(4)
        self.cls = paddle.nn.Conv2D(4, num_classes, 1)

    def forward(self, x):
        h = self.stem(x)
        y = self.bn(self.down(h))
        y = functional.relu(y + functional.avg_pool2d(h, 2))  # elementwise_add
        logit = self.cls(y)
        return [functional.interpolate(logit, x.shape[2:], mode="bilinear", align_corners=False)]  # bilinear_interp_v2


def loss_computation(logits_list, labels, losses):
    return [coef * fn(logits, labels) for logits, fn, coef in zip(logits_list, losses["types"], losses["coef"])]


def main():
    parser = argparse.ArgumentParser()
    common.add_common_args(parser)
    args = parser.parse_args()

    paddle.seed(0)
    model = TinySegNet()
    lr = paddle.optimizer.lr.PolynomialDecay(0.01, decay_steps=args.steps, end_lr=0.0, power=0.9)
    optimizer = paddle.optimizer.Momentum(lr, momentum=0.9, parameters=model.parameters(), weight_decay=4e-5)
    losses = {"types": [paddle.nn.CrossEntropyLoss(axis=1)], "coef": [1]}

    precision, amp_level = "fp16", "O1"
    scaler = None
    if precision == "fp16":
        scaler = paddle.amp.GradScaler(init_loss_scaling=1024)

    history, updates = [], 0
    rng = np.random.default_rng(7)
    model.train()
    for it in range(1, args.steps + 1):
        images = paddle.to_tensor(common.inject(common.images(it), it, args.overflow_step))
        labels = paddle.to_tensor(rng.integers(0, 3, (2, 8, 8)).astype("int64"))
        before = common.snapshot(model)
        if precision == "fp16":
            with paddle.amp.auto_cast(level=amp_level, enable=True,
                                      custom_white_list={"elementwise_add", "batch_norm", "sync_batch_norm"},
                                      custom_black_list={"bilinear_interp_v2"}):
                logits_list = model(images)
                loss_list = loss_computation(logits_list, labels, losses)
                loss = sum(loss_list)
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(optimizer, scaled)
        else:
            loss = sum(loss_computation(model(images), labels, losses))
            loss.backward()
            optimizer.step()
        lr_sche = optimizer._learning_rate  # what PaddleSeg reads
        if isinstance(lr_sche, paddle.optimizer.lr.LRScheduler):
            lr_sche.step()
        model.clear_gradients()
        updates += common.changed(before, model)
        history.append(float(loss))
        print(f"[TRAIN] iter: {it}/{args.steps}, loss: {history[-1]:.4f}, lr: {optimizer.get_lr():.6f}", flush=True)
        common.maybe_wait(it, args.wait_after)
    common.write_report(args.out, model, scaler, history, updates, lr)


if __name__ == "__main__":
    main()
