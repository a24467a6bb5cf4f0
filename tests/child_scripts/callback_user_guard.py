"""Run in a toolkit venv (PaddleFormers or PaddleNLP): AmpCallback with a guard the user installed.

The callback's hooks are called as the Trainer calls them (no scaler: bf16 or float32), twice
(two trainings), once with a guard the user put on the optimizer first (its own settings) and
once without. argv: OUT_DIR. Prints one JSON line.
"""

import json
import sys
from types import SimpleNamespace

import numpy as np
import paddle

import paddle_amp_ext as amp
from paddle_amp_ext.integrations.paddlenlp import AmpCallback


def nan_step(model, opt):
    x = paddle.ones([4, 3])
    loss = model(x).sum() * float("nan")
    loss.backward()
    opt.step()
    opt.clear_grad()


def run(out_dir, user_guard):
    paddle.seed(0)
    model = paddle.nn.Linear(3, 2)
    sched = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1)
    opt = paddle.optimizer.SGD(learning_rate=sched, parameters=model.parameters())
    mine = amp.guard_optimizer(opt, max_consecutive_skips=3) if user_guard else None
    callback = AmpCallback(logdir=out_dir)
    args, state, control = SimpleNamespace(logging_dir=out_dir), SimpleNamespace(), SimpleNamespace()
    report = {"trainings": []}
    for _ in range(2):
        for _ in range(2):
            callback.on_optimizer_begin(args, state, control, optimizer=opt, lr_scheduler=sched)
            before = model.weight.numpy().copy()
            nan_step(model, opt)
            sched.step()
            assert np.array_equal(before, model.weight.numpy())
        guard = callback.optimizer_guard
        during = {"is_users": guard is mine, "hooks": len(guard.hooks), "skipped": guard.skipped_steps,
                  "last_epoch": sched.last_epoch}
        callback.on_train_end(args, state, control)
        during.update(active_after=guard.active, step_replaced_after="step" in vars(opt),
                      hooks_after=len(guard.hooks), scheduler_held_after="step" in vars(sched))
        report["trainings"].append(during)
    if mine is not None:
        report["settings_kept"] = list(mine._settings)
        mine.remove()
    return report


out = sys.argv[1]
print(json.dumps({"user": run(out + "/user", True), "own": run(out + "/own", False)}))
