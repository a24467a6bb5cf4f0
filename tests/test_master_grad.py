"""fp32 master gradients (``param.main_grad``) through the scaler: unscale, found_inf, clip, guard.

Fleet's ``MixPrecisionLayer`` keeps every gradient in ``param.main_grad`` and clears
``param.grad``; ``MixPrecisionOptimizer`` applies ``main_grad``. The scaled run is compared with
a plain float32 control: inside fp16_emulation with ``matmul`` black-listed nothing is quantized,
and scaling by powers of two is exact.
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
from helpers import make_data, make_mlp, params_of
from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionLayer, MixPrecisionOptimizer

import paddle_amp_ext as amp
from paddle_amp_ext import _compat

FLEET_SCRIPT = Path(__file__).parent / "dist_scripts" / "mix_precision_scaler.py"


def master_grad_model(seed: int, lr: float = 0.05):
    """(wrapped model, inner model, optimizer) as fleet's mix-precision utilities build them."""
    inner = make_mlp(seed=seed)
    model = MixPrecisionLayer(inner, dtype="float16")
    opt = MixPrecisionOptimizer(paddle.optimizer.SGD(learning_rate=lr, parameters=inner.parameters()))
    return model, inner, opt


def loss_of(model, x, y, poison=None):
    loss = paddle.nn.functional.mse_loss(model(x), y)
    return loss * float(poison) if poison else loss


def control_grads(seed: int, x, y) -> list:
    control = make_mlp(seed=seed)
    loss_of(control, x, y).backward()
    return [p.grad.numpy().copy() for p in control.parameters()]


def main_grads(inner) -> list:
    return [p.main_grad.numpy().copy() for p in inner.parameters()]


def test_mix_precision_layer_keeps_gradients_only_in_main_grad():
    """The premise: param.grad is empty, so a scaler reading it sees nothing."""
    x, y = make_data()
    model, inner, _ = master_grad_model(seed=3)
    loss_of(model, x, y).backward()
    for param in inner.parameters():
        assert param.grad is None and param.main_grad.dtype == paddle.float32
        assert _compat.grad_of(param) is param.main_grad


def test_overflow_in_main_grad_is_found_the_step_skipped_and_gradients_unscaled_exactly():
    x, y = make_data()
    model, inner, opt = master_grad_model(seed=3)
    control = make_mlp(seed=3)
    opt_c = paddle.optimizer.SGD(learning_rate=0.05, parameters=control.parameters())
    scaler = amp.GradScaler(init_loss_scaling=2.0**10)
    skipped, scales = [], []
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        for poison in (None, "inf", None, "nan"):
            before = params_of(inner)
            scaler.scale(loss_of(model, x, y, poison)).backward()
            scaler.unscale_(opt)  # then step() must not unscale a second time
            if poison is None:
                loss_of(control, x, y).backward()
                for mine, ref in zip(main_grads(inner), [p.grad.numpy() for p in control.parameters()]):
                    np.testing.assert_array_equal(mine, ref)
                opt_c.step()
                opt_c.clear_grad()
            result = scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            skipped.append(result.skipped)
            scales.append(result.loss_scale)
            if poison:
                for a, b in zip(before, params_of(inner)):
                    np.testing.assert_array_equal(a, b)
            for a, b in zip(params_of(inner), params_of(control)):
                np.testing.assert_array_equal(a, b)
    assert skipped == [False, True, False, True]
    assert scales == [2.0**10, 2.0**10, 2.0**9, 2.0**9] and scaler.loss_scale == 2.0**8
    assert scaler.skipped_steps == 2


@pytest.mark.parametrize("scaling", [True, False], ids=["scaling-on", "scaling-off"])
def test_clip_is_applied_to_main_grad_with_paddles_global_norm(scaling):
    x, y = make_data()
    expected_norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in control_grads(6, x, y)))
    control = make_mlp(seed=6)
    opt_c = paddle.optimizer.SGD(learning_rate=0.5, parameters=control.parameters(),
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(0.05))
    loss_of(control, x, y).backward()
    opt_c.step()
    model, inner, opt = master_grad_model(seed=6, lr=0.5)
    scaler = amp.GradScaler(init_loss_scaling=2.0**8, enable=scaling)
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        scaler.scale(loss_of(model, x, y)).backward()
        result = scaler.step(opt, grad_clip=0.05)
        scaler.update()
    assert result.loss_scale == (2.0**8 if scaling else 1.0) and not result.skipped
    assert result.grad_norm is not None and expected_norm > 0.05, "clipping was active"
    np.testing.assert_allclose(float(result.grad_norm), expected_norm, rtol=1e-6)
    for a, b in zip(params_of(inner), params_of(control)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_record_grad_norm_reads_main_grad():
    x, y = make_data()
    model, inner, opt = master_grad_model(seed=2)
    events = []
    scaler = amp.GradScaler(hooks=[events.append])
    scaler.record_grad_norm = True
    scaler.scale(loss_of(model, x, y)).backward()
    scaler.step(opt)
    scaler.update()
    expected = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in control_grads(2, x, y)))
    np.testing.assert_allclose(float(events[0].result.grad_norm), expected, rtol=1e-6)


def test_guard_with_loss_scaling_off_skips_nan_in_main_grad():
    x, y = make_data()
    model, inner, opt = master_grad_model(seed=4)
    scaler = amp.GradScaler(enable=False)
    results = []
    for poison in (None, "nan", None):
        before = params_of(inner)
        scaler.scale(loss_of(model, x, y, poison)).backward()
        results.append(scaler.step(opt))
        scaler.update()
        opt.clear_grad()
        changed = [not np.array_equal(a, b) for a, b in zip(before, params_of(inner))]
        assert all(changed) if poison is None else not any(changed)
    assert [r.skipped for r in results] == [False, True, False]
    assert all(np.isfinite(p).all() for p in params_of(inner))


def test_found_inf_as_a_python_number_is_accepted():
    """What fleet's MixPrecisionScaler stores: read without a sync, all-reduced as a tensor."""
    from paddle_amp_ext.distributed import all_reduce_max, host_bool

    assert host_bool(1) is True and host_bool(0) is False
    assert all_reduce_max(1) == 1  # a single process: unchanged
    assert host_bool(paddle.to_tensor([1], dtype="int32")) is True


def run_fleet_script(tmp_path: Path) -> dict:
    """fleet.init needs a process of its own (it sets process-wide state); one process, no launch."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(FLEET_SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_fleets_mix_precision_scaler_with_its_int_found_inf(tmp_path):
    result = run_fleet_script(tmp_path)
    assert result["found_inf_types"] == ["int", "int", "int", "int"]
    assert result["skipped"] == [False, True, False, True]
    assert result["scales"] == [1024.0, 1024.0, 512.0, 512.0]
    assert result["grads_equal_control"] == [True, True]  # unscale_() then step(): unscaled once
    assert result["params_equal_control"] == [True, True, True, True]
    assert result["skipped_steps"] == 2 and result["optimizer_was_run"] == [True, False, True, False]
