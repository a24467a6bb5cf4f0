"""Hostile tests for routing's LR hold and its guard of scaler-less optimizers (real Paddle on a CPU)."""

from __future__ import annotations

import threading

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import lrhold
from paddle_amp_ext.guard import guard_of
from paddle_amp_ext.run.routing import active_routing


def _net(seed=3):
    paddle.seed(seed)
    return paddle.nn.Linear(4, 2)


def _backward(net, nan=False):
    loss = net(paddle.ones([2, 4])).mean()
    (loss * float("nan") if nan else loss).backward()


@pytest.mark.parametrize("name, value", [("hold_lr_on_skip", "yes"), ("hold_lr_on_skip", 1),
                                         ("guard_optimizers", None), ("guard_optimizers", 0.0)])
def test_the_opt_outs_take_only_bools(name, value):
    with pytest.raises(TypeError, match=rf"^{name} must be True or False\. Received: {name}={value!r} "
                                        rf"\(of type {type(value).__name__}\)$"):
        amp.route(**{name: value})
    assert active_routing() is None, "a refused routing is not left active"
    assert not lrhold.is_active()


def test_on_guard_must_be_callable():
    with pytest.raises(TypeError, match=r"^on_guard must be a callable taking the new OptimizerGuard\. "
                                        r"Received: on_guard=5$"):
        amp.routed(on_guard=5).__enter__()


def test_deactivate_without_activate_is_named():
    with pytest.raises(RuntimeError, match=r"^lrhold\.deactivate\(\) without a matching activate\(\)\.$"):
        lrhold.deactivate()


def test_a_scheduler_bound_to_no_optimizer_is_never_held():
    net = _net()
    free = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    inner = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    warm = paddle.optimizer.lr.LinearWarmup(inner, warmup_steps=1, start_lr=0.0, end_lr=1.0)
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=warm, parameters=net.parameters())
        for step in range(3):
            _backward(net, nan=step == 1)
            opt.step()
            opt.clear_grad()
            free.step()
            warm.step()
        assert routing.lr_steps_held == 1, "only the bound LinearWarmup, once"
    assert free.last_epoch == 3 and "step" not in vars(free) and "step" not in vars(inner)
    assert warm.last_epoch == 2


def test_a_float_learning_rate_and_a_constant_lr_optimizer_need_no_hold():
    net = _net()
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=net.parameters())
        _backward(net, nan=True)
        opt.step()
        assert routing.guards[0].skipped_steps == 1 and routing.lr_steps_held == 0
    assert opt.get_lr() == 0.5


def test_a_held_scheduler_still_refuses_bad_arguments_and_keeps_the_mark():
    net = _net()
    lr = paddle.optimizer.lr.ReduceOnPlateau(1.0)
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        _backward(net, nan=True)
        opt.step()
        with pytest.raises(TypeError):
            lr.step()  # ReduceOnPlateau needs metrics: Paddle's own error, not swallowed
        lr.step(1.0)
        assert routing.lr_steps_held == 1
        lr.step(1.0)
    assert lr.last_epoch == 1


def test_a_scheduler_shared_by_two_optimizers_is_held_once_per_skip():
    nets = [_net(1), _net(2)]
    shared = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        opts = [paddle.optimizer.SGD(learning_rate=shared, parameters=n.parameters()) for n in nets]
        for net, opt in zip(nets, opts):  # both skip the same iteration
            _backward(net, nan=True)
            opt.step()
            opt.clear_grad()
        shared.step()
        shared.step()  # a second call after one iteration is not held
        assert routing.lr_steps_held == 1
    assert shared.last_epoch == 1


def test_the_routing_puts_everything_back_and_a_later_wrapper_is_left_in_place():
    net = _net()
    lr = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    init = paddle.optimizer.AdamW.__init__
    with amp.routed():
        assert paddle.optimizer.AdamW.__init__ is not init
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        _backward(net)
        opt.step()
        ours = lr.step
        lr.step = lambda *a, **k: ours(*a, **k)  # something wraps the hold after it
        later = lr.step
    assert paddle.optimizer.AdamW.__init__ is init and paddle.optimizer.Optimizer.__init__.__name__ == "__init__"
    assert lr.step is later
    lr.step()
    assert lr.last_epoch == 1, "the hold left inside passes through once no routing is active"


def test_nested_routings_hold_while_any_holding_routing_is_active():
    net = _net()
    lr = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    outer = amp.route(hold_lr_on_skip=False, guard_optimizers=False)
    try:
        with amp.routed() as inner:
            opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
            _backward(net, nan=True)
            opt.step()
            lr.step()
            assert inner.lr_steps_held == 1
        assert not lrhold.is_active() and active_routing() is outer
        _backward(net, nan=True)
        opt.step()  # still guarded (guards stay on their optimizers), but no hold now
        lr.step()
    finally:
        outer.undo()
    assert lr.last_epoch == 1 and np.isfinite(net.weight.numpy()).all()


def test_an_optimizer_stepped_with_nan_in_a_thread_is_guarded_there():
    nets = [_net(1), _net(2)]
    errors, opts = [], []
    with amp.routed() as routing:
        barrier = threading.Barrier(2)

        def train(net, nan):
            try:
                lr = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
                opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
                opts.append((opt, lr, nan))
                barrier.wait(10)
                for step in range(3):
                    _backward(net, nan=nan and step == 1)
                    opt.step()
                    opt.clear_grad()
                    lr.step()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=train, args=(net, i == 0)) for i, net in enumerate(nets)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert routing.lr_steps_held == 1
    assert errors == [] and all(np.isfinite(n.weight.numpy()).all() for n in nets)
    by_nan = {nan: (guard_of(opt).skipped_steps, lr.last_epoch) for opt, lr, nan in opts}
    assert by_nan == {True: (1, 2), False: (0, 3)}


def test_a_scaler_in_another_thread_does_not_make_the_guard_defer_here():
    net, other = _net(1), _net(2)
    with amp.routed():
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
        inside = threading.Event()
        done = threading.Event()

        class Slow(paddle.optimizer.SGD):
            def step(self):
                inside.set()
                done.wait(30)
                return super().step()

        slow = Slow(learning_rate=0.1, parameters=other.parameters())
        scaler = amp.GradScaler()
        _backward(other)
        thread = threading.Thread(target=lambda: scaler.step(slow))
        thread.start()
        inside.wait(30)  # the scaler is applying its step in that thread now
        _backward(net, nan=True)
        opt.step()
        done.set()
        thread.join(30)
    assert guard_of(opt).skipped_steps == 1 and np.isfinite(net.weight.numpy()).all()


def test_guard_optimizers_false_builds_no_guard_and_a_static_program_is_left_alone():
    net = _net()
    with amp.routed(guard_optimizers=False) as routing:
        opt = paddle.optimizer.Adam(learning_rate=0.1, parameters=net.parameters())
    assert routing.guards == [] and guard_of(opt) is None
    paddle.enable_static()
    try:
        with amp.routed() as routing:
            paddle.optimizer.SGD(learning_rate=0.1)
        assert routing.guards == []
    finally:
        paddle.disable_static()


def test_a_nested_routing_without_guard_builds_unguarded_optimizers_inside_a_guarding_one():
    net = _net()
    with amp.routed() as outer:
        with amp.routed(guard_optimizers=False):
            bare = paddle.optimizer.AdamW(learning_rate=0.1, parameters=net.parameters())
        guarded = paddle.optimizer.AdamW(learning_rate=0.1, parameters=net.parameters())
    assert guard_of(bare) is None and outer.guards == [guard_of(guarded)]


def test_a_deep_copied_scheduler_is_not_held_and_steps_itself():
    """A copy is another scheduler, bound to no optimizer: never held (the original keeps its mark)."""
    import copy

    net = _net()
    lr = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        _backward(net, nan=True)
        opt.step()
        twin = copy.deepcopy(lr)  # copied while held
        twin.step()
        twin.step()
        assert routing.lr_steps_held == 0 and lrhold.held_steps(twin) == 0
        lr.step()
        assert routing.lr_steps_held == 1 and lrhold.held_steps(lr) == 1
    assert (lr.last_epoch, twin.last_epoch) == (0, 2)
    twin.step()
    assert twin.last_epoch == 3 and lr.last_epoch == 0
