"""Run in a toolkit venv (PaddleFormers or PaddleNLP): AmpCallback's scheduler hold under a routing.

The callback's hooks are called as the Trainer calls them (no scaler), inside ``amp.routed()``
(which guards the optimizer and holds its scheduler too): two NaN steps, each followed by
``lr.step()``, then train end, then the routing's end, then one more NaN step and ``lr.step()``.
argv: OUT_DIR. Prints one JSON line.
"""

import json
import sys
from types import SimpleNamespace

import paddle

import paddle_amp_ext as amp
from paddle_amp_ext.integrations.paddlenlp import AmpCallback


def nan_step(model, opt):
    (model(paddle.ones([4, 3])).sum() * float("nan")).backward()
    opt.step()
    opt.clear_grad()


out = sys.argv[1]
paddle.seed(0)
model = paddle.nn.Linear(3, 2)
sched = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1)
callback = AmpCallback(logdir=out)
args, state, control = SimpleNamespace(logging_dir=out), SimpleNamespace(), SimpleNamespace()
report = {}
with amp.routed():
    opt = paddle.optimizer.SGD(learning_rate=sched, parameters=model.parameters())
    for _ in range(2):
        callback.on_optimizer_begin(args, state, control, optimizer=opt, lr_scheduler=sched)
        nan_step(model, opt)
        sched.step()
    report["during"] = {"last_epoch": sched.last_epoch, "skipped": callback.optimizer_guard.skipped_steps}
    callback.on_train_end(args, state, control)
    report["after_training"] = {"own_step": "step" in vars(sched)}
nan_step(model, opt)  # still guarded (a routing's guard stays on its optimizer), but nothing holds now
sched.step()
report["after_routing"] = {"own_step": "step" in vars(sched),
                           "class_step_restored": "step" not in vars(paddle.optimizer.lr.StepDecay),
                           "last_epoch_after_nan": sched.last_epoch}
print(json.dumps(report))
