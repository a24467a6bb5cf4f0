"""A suite-shaped trainer (the shape of PaddleClas's ``Engine``, own code): YAML-driven, ``paddle.amp`` by attribute.

What matters for ``python -m paddle_amp_ext.run``: the scaler is built from the YAML ``AMP:``
section with ``paddle.amp.GradScaler(...)``, the model and optimizer go through
``paddle.amp.decorate(level=...)``, and ``auto_cast`` is bound with ``functools.partial`` when the
trainer is built (so whatever ``paddle.amp.auto_cast`` is then is what every step uses).
"""

import contextlib
import json
import os
from functools import partial

import numpy as np
import paddle


class AutoCast:
    """The training (and, with ``use_fp16_test``, evaluation) autocast context, bound once."""

    def __init__(self, use_amp, level="O1", use_promote=False, amp_eval=False):
        self.use_amp, self.amp_eval = use_amp, amp_eval
        if use_amp:
            self.cast_context = partial(paddle.amp.auto_cast, level=level, use_promote=use_promote)

    def __call__(self, is_eval=False):
        if self.use_amp and (not is_eval or self.amp_eval):
            return self.cast_context()
        return contextlib.nullcontext()


class NoScaler:
    """What the trainer uses without AMP: the scaler's calls, doing nothing."""

    def scale(self, loss):
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        pass


class SyntheticImages(paddle.io.Dataset):
    """Random images with soft labels (as mixup gives them); ``nan_batch`` corrupts one batch's labels,
    so that batch's loss and gradients are NaN while the forward pass (and BatchNorm's statistics) stay
    finite."""

    def __init__(self, samples, class_num, nan_batch=None, batch_size=1, seed=0):
        rng = np.random.default_rng(seed)
        self.images = rng.standard_normal((samples, 3, 8, 8)).astype("float32")
        self.labels = np.eye(class_num, dtype="float32")[rng.integers(0, class_num, samples)]
        if nan_batch:
            start = (nan_batch - 1) * batch_size
            self.labels[start:start + batch_size] = np.nan

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def build_model(class_num, channels):
    return paddle.nn.Sequential(
        paddle.nn.Conv2D(3, channels, 3, padding=1), paddle.nn.BatchNorm2D(channels), paddle.nn.ReLU(),
        paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten(), paddle.nn.Linear(channels, class_num))


class Engine:
    def __init__(self, config):
        self.config = config
        paddle.seed(config["Global"]["seed"])
        arch, opt, data = config["Arch"], config["Optimizer"], config["DataLoader"]
        self.model = build_model(arch["class_num"], arch["channels"])
        self.loss_func = paddle.nn.CrossEntropyLoss(soft_label=True)
        self.optimizer = paddle.optimizer.Momentum(learning_rate=opt["lr"], momentum=opt["momentum"],
                                                   parameters=self.model.parameters(),
                                                   multi_precision=opt["multi_precision"])
        train = data["Train"]
        self.train_loader = paddle.io.DataLoader(
            SyntheticImages(train["samples"], arch["class_num"], train.get("nan_batch"), train["batch_size"]),
            batch_size=train["batch_size"], shuffle=False, drop_last=True)
        evaluation = data["Eval"]
        self.eval_loader = paddle.io.DataLoader(SyntheticImages(evaluation["samples"], arch["class_num"], seed=1),
                                                batch_size=evaluation["batch_size"])
        self._init_amp()

    def _init_amp(self):
        amp = self.config.get("AMP") or {}
        use_amp = bool(amp.get("use_amp", False))
        if not use_amp:
            self.auto_cast, self.scaler = AutoCast(False), NoScaler()
            return
        level = amp.get("level", "O1")
        if level not in ("O1", "O2"):
            raise ValueError(f"AMP.level must be O1 or O2, got {level!r}")
        self.auto_cast = AutoCast(True, level=level, use_promote=amp.get("use_promote", False),
                                  amp_eval=amp.get("use_fp16_test", False))
        self.scaler = paddle.amp.GradScaler(init_loss_scaling=amp.get("scale_loss", 1.0),
                                            use_dynamic_loss_scaling=amp.get("use_dynamic_loss_scaling", False))
        if level == "O2":
            self.model, self.optimizer = paddle.amp.decorate(models=self.model, optimizers=self.optimizer,
                                                             level=level, save_dtype="float32")

    def train(self):
        history = []
        for epoch in range(1, self.config["Global"]["epochs"] + 1):
            self.model.train()
            for it, (images, labels) in enumerate(self.train_loader, start=1):
                with self.auto_cast(is_eval=False):
                    loss = self.loss_func(self.model(images), labels)
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.clear_grad()
                history.append(float(loss))
                if it % self.config["Global"]["print_batch_step"] == 0:
                    print(f"[Train][Epoch {epoch}][Iter: {it}] loss: {history[-1]:.5f}", flush=True)
        return history

    @paddle.no_grad()
    def eval(self):
        self.model.eval()
        correct = total = 0
        for images, labels in self.eval_loader:
            with self.auto_cast(is_eval=True):
                logits = self.model(images)
            correct += int((logits.argmax(axis=1) == labels.argmax(axis=1)).astype("int64").sum())
            total += len(labels)
        return correct / total

    def report(self, history, accuracy):
        """What the run did, as JSON in Global.output_dir (what a test of the trainer reads)."""
        out = self.config["Global"]["output_dir"]
        os.makedirs(out, exist_ok=True)
        weights = [p.numpy() for p in self.model.parameters()]
        data = {"losses": history, "eval_accuracy": accuracy,
                "scaler": f"{type(self.scaler).__module__}.{type(self.scaler).__name__}",
                "auto_cast": f"{self.auto_cast.cast_context.func.__module__}" if self.auto_cast.use_amp else None,
                "param_dtypes": sorted({str(p.dtype) for p in self.model.parameters()}),
                "weights_finite": bool(all(np.isfinite(w).all() for w in weights))}
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(data, f)
        return data
