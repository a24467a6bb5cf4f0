"""Under routing: LR schedulers hold on skipped steps, ``minimize`` records as ``step``, scaler-less optimizers are guarded.

Real Paddle on a CPU: the scaler runs for real inside ``fp16_emulation`` (loss scaling on, found_inf
from Paddle's ``check_finite_and_unscale``); outside it the scaler is off and its non-finite guard
decides (``skip_nonfinite``). A skipped step is made with an inf/nan loss at a known step.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import lrhold


class Events:
    def __init__(self):
        self.rows = []

    def on_step(self, event):
        norm = None if event.result.grad_norm is None else float(event.result.grad_norm)
        self.rows.append((event.step, event.lr, event.result.skipped, event.result.loss_scale, norm,
                          event.next_loss_scale))


def _net(seed=3):
    paddle.seed(seed)
    return paddle.nn.Linear(4, 2)


def _loss(net, step, poison, value=float("inf")):
    loss = net(paddle.ones([2, 4]) * 0.5).mean()
    return loss * value if step in poison else loss


def _machinery(net, emulate):
    return amp.fp16_emulation(net, custom_black_list=["matmul"]) if emulate else contextlib.nullcontext()


# ---------------------------------------------------------------- minimize records what step records
@pytest.mark.parametrize("emulate", [True, False], ids=["loss-scaling-on", "loss-scaling-off"])
def test_minimize_records_exactly_what_step_records(emulate):
    runs = {}
    for how in ("step", "minimize"):
        net = _net()
        lr = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.5)
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        events = Events()
        scaler = amp.GradScaler(init_loss_scaling=1024.0, hooks=[events])
        scaler.record_grad_norm = True
        results = []
        with _machinery(net, emulate):
            for step in range(4):
                scaled = scaler.scale(_loss(net, step, {1}))
                scaled.backward()
                if how == "step":
                    scaler.step(opt)
                    scaler.update()
                else:
                    out = scaler.minimize(opt, scaled)
                    assert (out == (None, None)) == (step == 1)
                results.append(scaler.last_result.skipped)
                opt.clear_grad()
                lr.step()
        runs[how] = (events.rows, results, [p.numpy().tolist() for p in net.parameters()], scaler.skipped_steps)
    assert runs["minimize"] == runs["step"]
    rows = runs["step"][0]
    assert [r[1] for r in rows] == [0.1, 0.05, 0.025, 0.0125], "the optimizer's rate at every step, a skipped one "\
        "too (not routed: the loop's lr.step() advanced on the skipped step)"
    assert [r[2] for r in rows] == [False, True, False, False]
    scales = [1024.0, 1024.0, 512.0, 512.0] if emulate else [1.0] * 4
    assert [r[3] for r in rows] == scales
    assert rows[1][4] is None or not np.isfinite(rows[1][4])
    assert all(np.isfinite(r[4]) for i, r in enumerate(rows) if i != 1)


# ---------------------------------------------------------------- the hold
def _seg_loop(routing_kwargs, steps=5, poison=(1, 2), emulate=True, minimize=True, sched=None):
    """A PaddleSeg-style loop: scaler.minimize (or step) then the loop's own lr.step() every iteration."""
    net = _net()
    lr = sched or paddle.optimizer.lr.PolynomialDecay(0.1, decay_steps=10, end_lr=0.0)
    with amp.routed(**routing_kwargs) as routing:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
        lrs = []
        with _machinery(net, emulate):
            for step in range(steps):
                scaled = scaler.scale(_loss(net, step, poison))
                scaled.backward()
                if minimize:
                    scaler.minimize(opt, scaled)
                else:
                    scaler.step(opt)
                    scaler.update()
                opt.clear_grad()
                lr.step()
                lrs.append(round(lr(), 6))
        held = routing.lr_steps_held
    return lr, lrs, held, routing


@pytest.mark.parametrize("minimize", [True, False], ids=["minimize", "step"])
@pytest.mark.parametrize("emulate", [True, False], ids=["loss-scaling-on", "loss-scaling-off"])
def test_the_loops_own_lr_step_is_held_once_per_skipped_step(minimize, emulate):
    lr, lrs, held, _ = _seg_loop({}, minimize=minimize, emulate=emulate)
    assert held == 2 and lr.last_epoch == 3, "5 steps, 2 skipped: the schedule advanced 3 times"
    assert lrs == [0.09, 0.09, 0.09, 0.08, 0.07]
    assert "step" not in vars(lr), "the scheduler's own step is back once the routing ends"
    control, lrs_c, held_c, _ = _seg_loop({"hold_lr_on_skip": False}, minimize=minimize, emulate=emulate)
    assert held_c == 0 and control.last_epoch == 5 and lrs_c == [0.09, 0.08, 0.07, 0.06, 0.05]


def test_explicit_epoch_calls_are_never_held_and_clear_the_mark():
    net = _net()
    lr = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        scaler = paddle.amp.GradScaler()
        for step, call in enumerate(["epoch", "implicit", "implicit"]):
            scaler.scale(_loss(net, step, {0}, float("nan"))).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            lr.step(epoch=7) if call == "epoch" else lr.step()
        assert routing.lr_steps_held == 0
    assert lr.last_epoch == 9 and lr() == 0.5**9


def test_reduce_on_plateau_step_metrics_is_held_with_last_epoch_consistent():
    net = _net()
    lr = paddle.optimizer.lr.ReduceOnPlateau(1.0, patience=0, factor=0.5)
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        scaler = paddle.amp.GradScaler()
        for step in range(4):
            loss = _loss(net, step, {2}, float("nan"))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            lr.step(float(loss))  # the NaN loss of the skipped step would count as a bad epoch
        assert routing.lr_steps_held == 1
    assert lr.last_epoch == 3 and lr.num_bad_epochs == 0 and lr() == 1.0


def test_step_scheduler_and_a_trainer_that_holds_itself_are_not_held_twice():
    net = _net()
    lr = paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5)
    with amp.routed() as routing:
        opt = paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters())
        scaler = paddle.amp.GradScaler()
        stepped = []
        for step in range(5):
            scaler.scale(_loss(net, step, {1, 3}, float("nan"))).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            if step < 2:
                stepped.append(scaler.step_scheduler(lr))
            elif not scaler._cache_found_inf:  # the Trainers' own hold
                lr.step()
        assert routing.lr_steps_held == 0
    assert stepped == [True, False] and lr.last_epoch == 3


def test_several_optimizers_and_a_scheduler_shared_by_two():
    nets = [_net(1), _net(2), _net(3)]
    own, shared = (paddle.optimizer.lr.StepDecay(1.0, step_size=1, gamma=0.5) for _ in range(2))
    with amp.routed() as routing:
        opt_a = paddle.optimizer.SGD(learning_rate=own, parameters=nets[0].parameters())
        opt_b = paddle.optimizer.SGD(learning_rate=shared, parameters=nets[1].parameters())
        opt_c = paddle.optimizer.SGD(learning_rate=shared, parameters=nets[2].parameters())
        scaler = paddle.amp.GradScaler()
        for step in range(3):
            for i, (net, opt) in enumerate(zip(nets, (opt_a, opt_b, opt_c))):
                _loss(net, step, {1} if i == 2 else set(), float("nan")).backward()  # only c skips, at step 1
                scaler.step(opt)
            scaler.update()
            for opt in (opt_a, opt_b, opt_c):
                opt.clear_grad()
            own.step()
            shared.step()
        assert routing.lr_steps_held == 1
    assert (own.last_epoch, shared.last_epoch) == (3, 2), "one of the shared scheduler's optimizers skipped"
    assert lrhold.held_steps(shared) == 0, "the count ended with the routing"


def test_hapi_fit_lr_scheduler_callback_is_held_on_skipped_batches():
    paddle.seed(0)
    x = paddle.randn([16, 4])
    y = paddle.randn([16, 2])
    y[4:8] = float("nan")  # the second batch of 4: NaN gradients with a finite forward
    net = paddle.nn.Linear(4, 2)
    lr = paddle.optimizer.lr.StepDecay(0.01, step_size=1, gamma=0.5)
    model = paddle.Model(net)
    with amp.routed() as routing:
        model.prepare(paddle.optimizer.SGD(learning_rate=lr, parameters=net.parameters()), paddle.nn.MSELoss(),
                      amp_configs={"level": "O1"})
        model.fit(paddle.io.TensorDataset([x, y]), batch_size=4, epochs=1, verbose=0, shuffle=False)
        (scaler,) = routing.scalers
    assert (scaler.skipped_steps, routing.lr_steps_held, lr.last_epoch) == (1, 1, 3)
    assert np.isfinite(net.weight.numpy()).all()


# ---------------------------------------------------------------- the guard of scaler-less optimizers
def _bf16_loop(routing_kwargs, steps=4, poison=(1,)):
    net = _net()
    lr = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.5)
    with amp.routed(**routing_kwargs) as routing:
        opt = paddle.optimizer.AdamW(learning_rate=lr, parameters=net.parameters())
        for step in range(steps):
            _loss(net, step, poison, float("nan")).backward()
            opt.step()
            opt.clear_grad()
            lr.step()
        guards = routing.guards
    return net, lr, guards, routing


def test_an_optimizer_stepped_without_a_scaler_is_guarded_under_routing():
    net, lr, (guard,), routing = _bf16_loop({})
    assert np.isfinite(net.weight.numpy()).all()
    assert (guard.skipped_steps, guard.last_step_skipped, routing.lr_steps_held, lr.last_epoch) == (1, False, 1, 3)
    assert guard.active, "the guard stays on its optimizer after the routing, as guard_optimizer's does"
    net, lr, guards, routing = _bf16_loop({"guard_optimizers": False})
    assert guards == [] and not np.isfinite(net.weight.numpy()).all(), "the control: Paddle applies the NaN"
    assert lr.last_epoch == 4 and routing.lr_steps_held == 0


def test_a_guard_defers_to_the_scaler_that_steps_its_optimizer():
    net = _net()
    events = Events()
    with amp.routed(on_guard=lambda g: g.add_hook(events)) as routing:
        opt = paddle.optimizer.Adam(learning_rate=0.1, parameters=net.parameters())
        scaler = paddle.amp.GradScaler()
        for step in range(3):
            scaler.scale(_loss(net, step, {1}, float("nan"))).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
        (guard,) = routing.guards
    assert scaler.skipped_steps == 1 and guard.last_result is None and events.rows == []
    assert np.isfinite(net.weight.numpy()).all()


def test_optimizers_built_outside_routing_are_left_alone():
    net = _net()
    before = paddle.optimizer.AdamW(learning_rate=0.1, parameters=net.parameters())
    with amp.routed() as routing:
        pass
    after = paddle.optimizer.Momentum(learning_rate=0.1, parameters=net.parameters())
    assert routing.guards == [] and amp.guard.guard_of(before) is None and amp.guard.guard_of(after) is None
    assert "step" not in vars(before) and "step" not in vars(after)


BF16_SCRIPT = """
import numpy as np
import paddle
paddle.seed(0)
net = paddle.nn.Linear(4, 2)
lr = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.5)
opt = paddle.optimizer.AdamW(learning_rate=lr, parameters=net.parameters())
for step in range(5):
    loss = net(paddle.ones([2, 4])).mean() * (float("nan") if step == 2 else 1.0)
    loss.backward()
    opt.step()
    opt.clear_grad()
    lr.step()
print("finite", bool(np.isfinite(net.weight.numpy()).all()), "last_epoch", lr.last_epoch)
"""


@pytest.mark.slow
def test_run_guards_a_scaler_less_loop_and_reports_the_holds(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BF16_SCRIPT)

    def run(*flags):
        proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--logdir", str(tmp_path / "runs"),
                               *flags, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    proc = run("--json")
    lines = proc.stdout.strip().splitlines()
    assert "finite True last_epoch 4" in lines
    summary = json.loads(lines[-1])
    (guard,) = summary["guards"]
    assert (summary["scalers"], guard["steps"], guard["skipped"], summary["lr_steps_held"]) == ([], 5, 1, 1)
    assert (summary["lr_hold"], summary["guard_optimizers"]) == (True, True)
    assert list((tmp_path / guard["logdir"]).glob("vdlrecords.*")), "the guard's steps have their VisualDL run"
    text = run("--no-log")
    assert "Optimizer guard 0 (steps without a GradScaler): 5 steps, 1 skipped" in text.stderr
    assert "LR scheduler: 1 lr.step() call(s) held after skipped steps" in text.stderr
    off = run("--json", "--no-guard", "--no-lr-hold", "--no-log")
    lines = off.stdout.strip().splitlines()
    assert "finite False last_epoch 5" in lines
    summary = json.loads(lines[-1])
    assert (summary["guards"], summary["lr_steps_held"], summary["guard_optimizers"]) == ([], 0, False)


DETECTION_SCRIPT = """
import json
import paddle
paddle.seed(0)
net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))
base = paddle.optimizer.lr.PiecewiseDecay(boundaries=[100], values=[0.01, 0.001])
lr = paddle.optimizer.lr.LinearWarmup(base, warmup_steps=10, start_lr=0.0, end_lr=0.01)
opt = paddle.optimizer.Momentum(learning_rate=lr, parameters=net.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**20)  # overflows float16 until it has backed off
x = paddle.randn([16, 8])
for step in range(10):
    with paddle.amp.auto_cast():
        loss = net(x).pow(2).mean()
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(opt, scaled)
    opt.clear_grad()
    lr.step()
print(json.dumps({"last_epoch": lr.last_epoch, "lr": round(lr(), 6)}))
"""


@pytest.mark.slow
def test_run_keeps_a_detection_style_warmup_from_being_spent_on_skipped_steps(tmp_path):
    """PaddleDetection's shape: a LinearWarmup stepped by the loop after every scaler.minimize(); the first
    steps overflow float16 (rehearsed) while the scale backs off."""
    script = tmp_path / "det.py"
    script.write_text(DETECTION_SCRIPT)

    def run(*flags):
        proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--json", "--no-log", "--emulate",
                               "float16", *flags, str(script)], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [line for line in proc.stdout.splitlines() if line]  # on a pipe the summary starts a new line
        return json.loads(lines[-2]), json.loads(lines[-1])

    seen, summary = run()
    (scaler,) = summary["scalers"]
    assert (scaler["steps"], scaler["skipped"], summary["lr_steps_held"]) == (10, 3, 3)
    assert seen == {"last_epoch": 7, "lr": 0.007}, "the warmup advanced on the 7 applied steps only"
    seen, summary = run("--no-lr-hold")
    assert summary["lr_steps_held"] == 0 and seen == {"last_epoch": 10, "lr": 0.01}
