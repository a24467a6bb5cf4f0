"""Which gradient a step applies, per optimizer class and Paddle version, against what it does.

Every ``paddle.optimizer`` class, fleet's wrappers and the Trainers' optimizers are stepped with a
NaN ``.grad`` beside a finite ``main_grad`` (and the reverse) in a child process
(tests/child_scripts/which_gradient.py); the weights show which one was applied, and that must be
what the guard, the unscale and the clip judge. Then the cases a hostile user meets: Adam/AdamW
with a ``main_grad`` they never read (NaN ``.grad`` beside it, ``step(grad_clip=)``, a stale
wrong-shape one), and a parameter listed twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat
from paddle_amp_ext._compat import optimizer as compat_opt

SCRIPT = Path(__file__).resolve().parents[1] / "child_scripts" / "which_gradient.py"
PADDLE3 = _compat.PADDLE_VERSION >= (3, 0, 0)


def _table(group: str, python: str = sys.executable) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # fleet.init refuses it on a CPU
    env["PYTHONPATH"] = os.pathsep.join([str(Path(amp.__file__).parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run([python, str(SCRIPT), group], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _disagreements(table: dict) -> dict:
    return {name: pair for name, pair in table.items() if pair[0] != pair[1]}


def test_every_paddle_optimizer_class_applies_the_gradient_the_package_judges():
    table = _table("paddle")
    assert _disagreements(table) == {}
    names = {"SGD", "Momentum", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSProp", "Lamb", "LBFGS"}
    if PADDLE3:
        names |= {"NAdam", "RAdam", "ASGD", "Rprop"}
    assert names <= set(table), sorted(table)
    first, never = compat_opt.MAIN_GRAD_FIRST, compat_opt.MAIN_GRAD_NEVER
    assert table["Adam"] == table["AdamW"] == table["LBFGS"] == [never, never]
    assert table["SGD"] == table["Momentum"] == ([first, first] if PADDLE3 else [never, never])
    assert all(table[f"{name}(param groups)"] == [never, never] for name in names)
    assert table["LookAhead(AdamW)"] == table["ASP(AdamW)"] == table["incubate LBFGS"] == [never, never]
    assert table["LookAhead(SGD)"] == table["ASP(SGD)"] == table["SGD"]


def test_fleets_wrappers_apply_the_gradient_the_package_judges():
    table = _table("fleet")
    assert _disagreements(table) == {}
    first, only, never = compat_opt.MAIN_GRAD_FIRST, compat_opt.MAIN_GRAD_ONLY, compat_opt.MAIN_GRAD_NEVER
    assert table["HybridParallelOptimizer(AdamW)"] == [never, never]
    assert table["HybridParallelOptimizer(SGD)"] == ([first, first] if PADDLE3 else [never, never])
    assert table["DygraphShardingOptimizer(AdamW)"] == table["DygraphShardingOptimizer(SGD)"] == [first, first]
    assert table["HybridParallelOptimizer(MixPrecisionOptimizer)(AdamW)"] == [only, only]


@pytest.mark.parametrize("variable, group, expected", [
    ("PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "paddleformers",
     {"AdamWMini": ["grad only"] * 2, "AdamWCustom": ["grad only"] * 2,
      "MixPrecisionOptimizer(AdamWMini)": ["main_grad only"] * 2}),
    ("PADDLE_AMP_EXT_PADDLENLP_PYTHON", "paddlenlp",
     {"Trainer's AdamW": ["grad only"] * 2, "MixPrecisionOptimizer(Trainer's AdamW)": ["main_grad only"] * 2}),
])
def test_the_trainers_optimizers_apply_the_gradient_the_package_judges(variable, group, expected):
    python = os.environ.get(variable)
    if not python:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the {group} optimizers: {variable} is not set")
        pytest.skip(f"{variable} is not set (bash scripts/test builds the toolkit's venv)")
    assert _table(group, python) == expected


def test_a_class_that_overrides_step_reads_what_its_paddle_base_reads_and_a_duck_is_followed_inside():
    class MyAdamW(paddle.optimizer.AdamW):
        def step(self):  # a script's override calling its base
            super().step()

    class Wrapper:  # no Paddle class: followed through _inner_opt
        def __init__(self, inner):
            self._inner_opt = inner

    layer = paddle.nn.Linear(2, 2)
    mine = MyAdamW(learning_rate=0.1, parameters=layer.parameters())
    assert compat_opt.main_grad_rule(mine) == compat_opt.MAIN_GRAD_NEVER
    assert compat_opt.main_grad_rule(Wrapper(mine)) == compat_opt.MAIN_GRAD_NEVER
    assert compat_opt.main_grad_rule(Wrapper(None)) == compat_opt.MAIN_GRAD_FIRST
    looped = Wrapper(None)
    looped._inner_opt = looped  # a cycle ends
    assert compat_opt.main_grad_rule(looped) == compat_opt.MAIN_GRAD_FIRST
    assert compat_opt.step_reads(int) is None and compat_opt.step_reads(object()) is None


# ---------------------------------------------------------------------- Adam/AdamW beside a main_grad
def _layer_with_grads(seed: int = 0):
    paddle.seed(seed)
    layer = paddle.nn.Linear(3, 2)
    (layer(paddle.ones([4, 3])) * 10).sum().backward()
    return layer


@pytest.mark.parametrize("cls", [paddle.optimizer.Adam, paddle.optimizer.AdamW])
def test_a_nan_grad_beside_a_finite_main_grad_does_not_reach_adams_weights_through_the_guard(cls):
    layer = _layer_with_grads()
    opt = cls(learning_rate=0.1, parameters=layer.parameters())
    guard = amp.guard_optimizer(opt)
    for param in layer.parameters():
        param._grad_ivar().set_value(paddle.full(param.shape, float("nan")))
        param.main_grad = paddle.ones(param.shape, "float32")  # finite, and never read by Adam
    before = [p.numpy().copy() for p in layer.parameters()]
    opt.step()
    assert guard.last_step_skipped and guard.skipped_steps == 1
    for old, param in zip(before, layer.parameters()):
        np.testing.assert_array_equal(param.numpy(), old)
    guard.remove()


def test_step_grad_clip_clips_the_gradient_adamw_applies_as_paddles_own_clip_does():
    runs = []
    for ours in (True, False):
        layer = _layer_with_grads(seed=4)
        clip = None if ours else paddle.nn.ClipGradByGlobalNorm(0.5)
        opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=layer.parameters(), grad_clip=clip)
        for param in layer.parameters():
            param.main_grad = paddle.full(param.shape, 1e-3, "float32")  # small: a clip judged on it does nothing
        if ours:
            expected = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in layer.parameters()))
            scaler = amp.GradScaler(enable=False)
            result = scaler.step(opt, grad_clip=0.5)
            scaler.update()
            assert expected > 0.5, "the clip was active"
            np.testing.assert_allclose(float(result.grad_norm), expected, rtol=1e-6)
        else:
            opt.step()
        runs.append([p.numpy() for p in layer.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cls", [paddle.optimizer.Adam, paddle.optimizer.AdamW])
def test_a_stale_wrong_shape_main_grad_adam_never_reads_does_not_make_the_step_raise(cls):
    layer = _layer_with_grads()
    opt = cls(learning_rate=0.1, parameters=layer.parameters())
    layer.weight.main_grad = paddle.ones([7], "float32")  # left from another model, wrong shape
    layer.bias.main_grad = "stale"
    scaler = amp.GradScaler(enable=False)
    before = layer.weight.numpy().copy()
    result = scaler.step(opt, grad_clip=1.0)
    scaler.update()
    assert result.skipped is False and not np.array_equal(layer.weight.numpy(), before)
    guard = amp.guard_optimizer(opt)
    opt.step()
    assert not guard.last_step_skipped
    guard.remove()


# ---------------------------------------------------------------------- a parameter listed twice
def _twice(clip=None):
    paddle.seed(0)
    layer = paddle.nn.Linear(3, 2)
    opt = paddle.optimizer.SGD(learning_rate=1.0, parameters=[layer.weight, layer.weight, layer.bias], grad_clip=clip)
    (layer(paddle.ones([2, 3])) * 10).sum().backward()
    return layer, opt


def test_a_parameter_listed_twice_has_its_gradient_clipped_once():
    layer, opt = _twice()
    grad = layer.weight.grad.numpy().copy()  # 20 everywhere; the bias' 20 too
    scaler = amp.GradScaler(enable=False)
    result = scaler.step(opt, grad_clip=paddle.nn.ClipGradByGlobalNorm(0.01))
    scaler.update()
    norm = np.sqrt(np.float64(8 * 20.0**2))  # each gradient once: 6 weights and 2 biases of 20
    assert float(result.grad_norm) == pytest.approx(norm, rel=1e-6)
    np.testing.assert_allclose(layer.weight.grad.numpy(), grad * (0.01 / norm), rtol=1e-5)


@pytest.mark.parametrize("clip", [paddle.nn.ClipGradByNorm(0.01), paddle.nn.ClipGradByValue(0.001)],
                         ids=["by-norm", "by-value"])
def test_a_parameter_listed_twice_is_clipped_as_paddles_per_tensor_clips_do(clip):
    runs = []
    for ours in (True, False):
        layer, opt = _twice(None if ours else clip)
        if ours:
            scaler = amp.GradScaler(enable=False)
            scaler.step(opt, grad_clip=clip)
            scaler.update()
        else:
            opt.step()
        runs.append([p.numpy() for p in layer.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_parameter_listed_twice_is_unscaled_once():
    paddle.seed(0)
    layer = paddle.nn.Linear(3, 2)
    opt = paddle.optimizer.SGD(learning_rate=1.0, parameters=[layer.weight, layer.weight, layer.bias])
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    with amp.fp16_emulation(layer):
        scaler.scale(layer(paddle.ones([2, 3])).sum()).backward()
        scaled = layer.weight.grad.numpy().copy()
        scaler.unscale_(opt)
        np.testing.assert_array_equal(layer.weight.grad.numpy(), scaled / np.float32(1024.0))
        assert len(amp.gradients.applied_grads(opt)) == 2


# ---------------------------------------------------------------------- parameter groups and the clip
def test_step_grad_clip_clips_every_group_by_one_norm_where_paddles_optimizer_clip_clips_each_group():
    """Documented in docs/differences.md: one global norm over every group (the norm reported and
    judged); the optimizer's own ``grad_clip=`` clips each group by its own norm, inside its step."""
    def run(ours: bool):
        paddle.seed(0)
        a, b = paddle.nn.Linear(3, 2), paddle.nn.Linear(3, 2)
        clip = None if ours else paddle.nn.ClipGradByGlobalNorm(1.0)
        opt = paddle.optimizer.SGD(learning_rate=1.0, grad_clip=clip,
                                   parameters=[{"params": a.parameters()}, {"params": b.parameters()}])
        (a(paddle.ones([2, 3])).sum() * 10 + b(paddle.ones([2, 3])).sum()).backward()
        grads = [p.grad.numpy().astype(np.float64) for p in a.parameters() + b.parameters()]
        before = [p.numpy().copy() for p in a.parameters() + b.parameters()]
        scaler = amp.GradScaler(enable=False)
        result = scaler.step(opt, grad_clip=1.0 if ours else None)
        scaler.update()
        moved = [w - p.numpy() for w, p in zip(before, a.parameters() + b.parameters())]
        return grads, moved, result

    grads, moved, result = run(ours=True)
    norm_a, norm_b = (np.sqrt(sum((g**2).sum() for g in part)) for part in (grads[:2], grads[2:]))
    assert float(result.grad_norm) == pytest.approx(np.hypot(norm_a, norm_b), rel=1e-6)
    for g, m in zip(grads, moved):
        np.testing.assert_allclose(m, g / np.hypot(norm_a, norm_b), rtol=1e-5)
    grads, moved, _ = run(ours=False)
    for g, m, norm in zip(grads, moved, (norm_a, norm_a, norm_b, norm_b)):
        np.testing.assert_allclose(m, g / norm, rtol=1e-5)
