"""The LR hold as a hostile user meets it: subclasses with their own ``step``, copies, pickles,
state dicts, garbage collection, threads, and AmpCallback's hold beside the routing's.

Real Paddle schedulers and optimizers on a CPU, both versions.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import subprocess
import sys
import threading

import paddle
import pytest
from helpers import run_trainer_check

import paddle_amp_ext as amp
from paddle_amp_ext import lrhold

StepDecay = paddle.optimizer.lr.StepDecay


def _skipped_step(scheduler, seed: int = 3):
    """An optimizer bound to ``scheduler``, built under the current routing, and one skipped step."""
    paddle.seed(seed)
    net = paddle.nn.Linear(4, 2)
    opt = paddle.optimizer.SGD(learning_rate=scheduler, parameters=net.parameters())
    (net(paddle.ones([2, 4])).mean() * float("nan")).backward()
    opt.step()
    opt.clear_grad()
    return opt


class StarStep(StepDecay):
    """A subclass that overrides ``step(*args, **kwargs)``."""

    def step(self, *args, **kwargs):
        return super().step(*args, **kwargs)


class NamedStep(StepDecay):
    """A subclass that names its argument otherwise."""

    def step(self, t=None):
        return super().step(t)


@pytest.mark.parametrize("cls, explicit", [
    (StarStep, ((3,), {})), (StarStep, ((), {"epoch": 3})),
    (NamedStep, ((3,), {})), (NamedStep, ((), {"t": 3})), (StepDecay, ((3,), {})), (StepDecay, ((), {"epoch": 3})),
], ids=["star-positional", "star-keyword", "named-positional", "named-keyword", "plain-positional", "plain-keyword"])
def test_an_explicit_argument_passes_through_whatever_the_subclass_calls_it(cls, explicit):
    lr = cls(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        _skipped_step(lr)
        args, kwargs = explicit
        lr.step(*args, **kwargs)
        assert lr.last_epoch == 3 and routing.lr_steps_held == 0
        lr.step()  # the explicit call cleared the mark
        assert lr.last_epoch == 4
    assert "step" not in vars(lr)


@pytest.mark.parametrize("cls, call", [
    (StarStep, ((), {})), (NamedStep, ((), {})), (StepDecay, ((), {})),
    (NamedStep, ((None,), {})), (StepDecay, ((), {"epoch": None})),  # the default, said: still implicit
], ids=["star", "named", "plain", "named-None", "plain-epoch-None"])
def test_an_implicit_step_is_held_once_whatever_the_subclass(cls, call):
    lr = cls(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        _skipped_step(lr)
        lr.step(*call[0], **call[1])
        assert lr.last_epoch == 0 and routing.lr_steps_held == 1 and lrhold.held_steps(lr) == 1
        lr.step()
        assert lr.last_epoch == 1
    assert vars(StepDecay).get("step") is None, "StepDecay's inherited step is back"


def test_a_subclass_that_overrides_step_gets_its_own_step_back():
    own = vars(StarStep)["step"]
    with amp.routed():
        _skipped_step(StarStep(1.0, step_size=1))
        assert vars(StarStep)["step"] is not own
    assert vars(StarStep)["step"] is own


def test_a_shallow_copy_of_a_held_scheduler_advances_itself_not_the_original():
    lr = StepDecay(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        _skipped_step(lr)
        twin = copy.copy(lr)
        twin.step()
        assert (lr.last_epoch, twin.last_epoch) == (0, 1) and routing.lr_steps_held == 0
        lr.step()  # the original's mark is still there
        assert lr.last_epoch == 0 and routing.lr_steps_held == 1


def _pickle_loads_in_a_fresh_process(blob: bytes) -> str:
    code = ("import pickle, sys; s = pickle.loads(sys.stdin.buffer.read()); s.step(); "
            "print(type(s).__name__, s.last_epoch, sorted(vars(s)) == sorted(vars(type(s)(1.0, step_size=1))))")
    proc = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout.decode().split()[-3:]


def test_a_held_scheduler_pickles_and_loads_anywhere_and_its_state_dict_is_clean():
    lr = StepDecay(1.0, step_size=1, gamma=0.5)
    plain = StepDecay(1.0, step_size=1, gamma=0.5)
    with amp.routed():
        _skipped_step(lr)
        blob = pickle.dumps(lr)
        back = pickle.loads(blob)
        assert sorted(vars(back)) == sorted(vars(plain)) and back.last_epoch == 0
        back.step()  # bound to no optimizer: not held
        assert back.last_epoch == 1
        assert lr.state_dict() == plain.state_dict()
        twin = StepDecay(1.0, step_size=1, gamma=0.5)
        twin.set_state_dict(lr.state_dict())
        assert twin.last_epoch == 0
        assert sorted(vars(lr)) == sorted(vars(plain))
    assert _pickle_loads_in_a_fresh_process(blob) == ["StepDecay", "1", "True"]


class EverythingSaved(StepDecay):
    """A subclass whose state_dict saves every attribute of the object."""

    def state_keys(self):
        self.keys = sorted(vars(self))


def test_a_state_dict_of_every_attribute_holds_nothing_of_the_package():
    lr, plain = EverythingSaved(1.0, step_size=1), EverythingSaved(1.0, step_size=1)
    with amp.routed():
        _skipped_step(lr)
        lr.step()
        assert lr.state_dict().keys() == plain.state_dict().keys()
        assert pickle.loads(pickle.dumps(lr.state_dict())) == lr.state_dict()


def test_a_held_scheduler_that_is_collected_leaves_nothing_behind():
    with amp.routed():
        lr = StepDecay(1.0, step_size=1)
        opt = _skipped_step(lr)
        assert len(lrhold._holds) == 1
        del lr, opt
        gc.collect()
        assert lrhold._holds == {}
        fresh = StepDecay(1.0, step_size=1)  # may reuse the id: not held
        fresh.step()
        assert fresh.last_epoch == 1


def test_schedulers_held_and_stepped_in_many_threads_each_hold_once():
    schedulers = [StepDecay(1.0, step_size=1) for _ in range(4)]
    errors = []

    def work(lr):
        try:
            for _ in range(5):
                _skipped_step(lr)
                lr.step()
                lr.step()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with amp.routed() as routing:
        threads = [threading.Thread(target=work, args=(lr,)) for lr in schedulers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == [] and routing.lr_steps_held == 20
        assert [lrhold.held_steps(lr) for lr in schedulers] == [5] * 4
    assert [lr.last_epoch for lr in schedulers] == [5] * 4


@pytest.mark.parametrize("via", ["step", "minimize"])
def test_a_guarded_step_skipped_under_an_active_hold_holds_the_next_implicit_step(via):
    """No routing and no scaler in the loop: ``guard_optimizer`` and ``lrhold.activate()`` alone
    (as AmpCallback uses them), each decision noted as the scaler's is."""
    lr = StepDecay(1.0, step_size=1, gamma=0.5)
    paddle.seed(3)
    net = paddle.nn.Linear(4, 2)
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
    guard = amp.guard_optimizer(opt)

    def step(scale):
        loss = net(paddle.ones([2, 4])).mean() * scale
        loss.backward()
        opt.step() if via == "step" else opt.minimize(loss)
        opt.clear_grad()

    lrhold.activate()
    try:
        epochs = []
        for scale in (float("nan"), 1.0, float("nan"), float("nan")):
            step(scale)
            lr.step()
            epochs.append(lr.last_epoch)
        step(float("nan"))
        lr.step(5)  # explicit: never held
        epochs.append(lr.last_epoch)
        assert (epochs, lrhold.held_steps(lr), guard.skipped_steps) == ([0, 1, 1, 1, 5], 3, 4)
    finally:
        lrhold.deactivate()
        guard.remove()
    step(float("nan"))
    lr.step()  # inactive: not held
    assert lr.last_epoch == 6 and "step" not in vars(StepDecay) and sorted(vars(lr)) == sorted(
        vars(StepDecay(1.0, step_size=1, gamma=0.5)))


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "PADDLE_AMP_EXT_PADDLENLP_PYTHON"])
def test_amp_callback_under_routing_leaves_no_hold_on_the_scheduler(variable, tmp_path):
    report, _ = run_trainer_check(variable, "child_scripts/callback_routing_hold.py", tmp_path)
    assert report["during"] == {"last_epoch": 0, "skipped": 2}
    assert report["after_training"] == {"own_step": False}
    assert report["after_routing"] == {"own_step": False, "class_step_restored": True, "last_epoch_after_nan": 1}


class _Frozen(type):
    def __setattr__(cls, name, value):
        raise AttributeError(f"{cls.__name__} is frozen: cannot set {name}")


class FrozenStep(StepDecay, metaclass=_Frozen):
    """A scheduler class that refuses new attributes (its step cannot be wrapped)."""


def test_a_scheduler_class_that_refuses_the_hold_is_said_once_and_steps_as_ever(caplog_amp):
    lr = FrozenStep(1.0, step_size=1)
    with amp.routed() as routing:
        _skipped_step(lr)
        lr.step()
        _skipped_step(lr)
        lr.step()
        assert lr.last_epoch == 2 and routing.lr_steps_held == 0
    said = [r.getMessage() for r in caplog_amp.records if "cannot be wrapped" in r.getMessage()]
    assert said == ["FrozenStep.step cannot be wrapped (FrozenStep is frozen: cannot set step), so its schedule "
                    "is not held on skipped steps."]
