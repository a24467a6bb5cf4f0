"""What the Trainer checks (tests/paddlenlp_trainer_check.py, tests/paddleformers_trainer_check.py) share.

Imported by those scripts in the toolkit's venv: the callbacks subclass the ``TrainerCallback`` of
whichever toolkit is installed, the one ``AmpCallback`` subclasses.
"""

import numpy as np
import paddle

from paddle_amp_ext.integrations.paddlenlp import TrainerCallback


class TokenIds(paddle.io.Dataset):
    """Random token ids: labelled with ``classes`` classes, else with the ids (a language model's labels)."""

    def __init__(self, n=32, classes=None):
        rng = np.random.default_rng(0)
        self.ids = rng.integers(1, 90, size=(n, 12)).astype("int64")
        self.labels = self.ids if classes is None else rng.integers(0, classes, size=(n,)).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class StopAt(TrainerCallback):
    """An interrupted run: the same schedule as the whole run, stopped after a checkpoint."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True


class Poison(TrainerCallback):
    """A non-finite gradient injected before the optimizer step of the chosen (1-based) steps, written
    where the gradients are: the float32 master gradient ``main_grad`` when it is set. Records, after
    every step, the step, the LR and the scheduler's ``last_epoch`` (``seen``)."""

    def __init__(self, model, steps, value=float("inf")):
        self.model, self.steps, self.value = model, steps, value
        self.seen, self.poisoned = [], []

    def on_optimizer_begin(self, args, state, control, scaler=None, **kwargs):
        if state.global_step + 1 in self.steps:
            param = next(p for p in self.model.parameters()
                         if getattr(p, "main_grad", None) is not None or p.grad is not None)
            where = "main_grad" if getattr(param, "main_grad", None) is not None else "grad"
            grad = param.main_grad if where == "main_grad" else param._grad_ivar()
            with paddle.no_grad():
                paddle.assign(paddle.full_like(grad, self.value), output=grad)
            self.poisoned.append(where)

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append({"step": state.global_step, "lr": float(kwargs["optimizer"].get_lr()),
                          "last_epoch": kwargs["lr_scheduler"].last_epoch})
