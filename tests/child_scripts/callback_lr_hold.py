"""Run in a toolkit venv (PaddleFormers or PaddleNLP): AmpCallback's LR hold leaves the scheduler object alone.

The callback's hooks are called as the Trainer calls them (no scaler: bf16 or float32). Reports,
as one JSON line: what the scheduler object looks like during training (``vars``, a pickle, a
copy, a state dict of every attribute) and after it; a training whose ``on_train_end`` never
comes; two Trainers' trainings overlapping, in one thread and in two; a fork during training.
argv: OUT_DIR.
"""

import copy
import gc
import json
import os
import pickle
import sys
import threading
from types import SimpleNamespace

import paddle

from paddle_amp_ext import lrhold
from paddle_amp_ext.integrations.paddlenlp import AmpCallback

StepDecay = paddle.optimizer.lr.StepDecay
OUT = sys.argv[1]
ARGS, STATE, CONTROL = SimpleNamespace(logging_dir=OUT), SimpleNamespace(), SimpleNamespace()


class EverythingSaved(StepDecay):
    """A scheduler whose state_dict saves every attribute of the object."""

    def state_keys(self):
        self.keys = sorted(vars(self))


class Training:
    """A model, an optimizer bound to ``sched`` and an AmpCallback, stepped as the Trainer steps them."""

    def __init__(self, sched, seed=0):
        paddle.seed(seed)
        self.model = paddle.nn.Linear(3, 2)
        self.sched = sched
        self.opt = paddle.optimizer.SGD(learning_rate=sched, parameters=self.model.parameters())
        self.callback = AmpCallback(logdir=OUT, report_to="none")

    def step(self, nan):
        """on_optimizer_begin, a guarded step (NaN gradients when ``nan``), then the Trainer's lr.step()."""
        self.callback.on_optimizer_begin(ARGS, STATE, CONTROL, optimizer=self.opt, lr_scheduler=self.sched)
        loss = self.model(paddle.ones([4, 3])).sum() * (float("nan") if nan else 1.0)
        loss.backward()
        self.opt.step()
        self.opt.clear_grad()
        self.sched.step()
        return self.sched.last_epoch

    def end(self):
        self.callback.on_train_end(ARGS, STATE, CONTROL)


def restored():
    """Whether nothing holds: lrhold inactive and StepDecay's class step its own again."""
    return not lrhold.is_active() and "step" not in vars(StepDecay) and "step" not in vars(EverythingSaved)


def the_object_during_and_after_training():
    plain = EverythingSaved(1.0, step_size=1)
    run = Training(EverythingSaved(1.0, step_size=1))
    epochs = [run.step(nan=True)]  # held: last_epoch stays 0
    sched = run.sched
    report = {"vars_during": sorted(vars(sched)) == sorted(vars(plain))}
    back = pickle.loads(pickle.dumps(sched))
    back.step()  # bound to no optimizer: steps itself
    report["pickle_during"] = [back.last_epoch, sorted(vars(back)) == sorted(vars(plain))]
    twin = copy.copy(sched)
    twin.step()
    report["copy_during"] = [twin.last_epoch, sched.last_epoch]
    deep = copy.deepcopy(sched)
    deep.step()
    report["deepcopy_during"] = [deep.last_epoch, sched.last_epoch]
    report["state_dict_during"] = sorted(sched.state_dict()) == sorted(plain.state_dict())
    epochs += [run.step(nan=False), run.step(nan=True), run.step(nan=False)]
    report["epochs"] = epochs
    report["held"] = lrhold.held_steps(sched)
    report["skipped"] = run.callback.optimizer_guard.skipped_steps  # one guard for the whole training
    run.end()
    report["vars_after"] = sorted(vars(sched)) == sorted(vars(plain))
    report["restored_after"] = restored()
    return report


def train_end_never_comes():
    run = Training(StepDecay(1.0, step_size=1))
    report = {"first": [run.step(nan=True), run.step(nan=True)]}  # an exception ends training here
    report["second"] = [run.step(nan=True), run.step(nan=False)]  # the same callback trains again
    report["active_then"] = lrhold.is_active()
    sched = run.sched
    del run
    gc.collect()
    report["restored_once_collected"] = restored()
    sched.step()  # nothing holds it now
    report["last_epoch"] = sched.last_epoch
    return report


def two_trainers_in_one_thread():
    one, two = Training(StepDecay(1.0, step_size=1)), Training(StepDecay(1.0, step_size=1), seed=1)
    report = {"one": [one.step(nan=True)], "two": [two.step(nan=True)]}
    one.end()
    report["two"].append(two.step(nan=True))  # one's end leaves two's hold in force
    report["active_after_one"] = lrhold.is_active()
    two.end()
    report["restored"] = restored()
    return report


def two_trainers_in_two_threads():
    runs = [Training(StepDecay(1.0, step_size=1), seed=i) for i in range(2)]
    epochs, held, errors = [[] for _ in runs], [0, 0], []

    def train(i):
        try:
            for nan in (True, False, True, True, False):
                epochs[i].append(runs[i].step(nan))
            held[i] = lrhold.held_steps(runs[i].sched)
            runs[i].end()
        except Exception as exc:  # noqa: BLE001 - reported
            errors.append(repr(exc))

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return {"epochs": epochs, "errors": errors, "held": held,
            "restored": restored()}


def a_fork_during_training():
    run = Training(StepDecay(1.0, step_size=1))
    run.step(nan=False)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child trains on, with the hold it inherited, and ends its training
        try:
            child = [run.step(nan=True), run.step(nan=False)]
            run.end()
            os.write(write, json.dumps({"epochs": child, "restored": restored()}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
    parent = [run.step(nan=True), run.step(nan=False)]  # the child's end ended nothing here
    run.end()
    return {"child": child, "parent": parent, "restored": restored()}


report = {}
for check in (the_object_during_and_after_training, train_end_never_comes, two_trainers_in_one_thread,
              two_trainers_in_two_threads, a_fork_during_training):
    report[check.__name__] = check()
    assert restored(), check.__name__
print(json.dumps(report))
