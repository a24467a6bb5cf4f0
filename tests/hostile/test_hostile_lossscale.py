"""A GradScaler state dict whose scale sits on a bound float32 cannot hold (lossscale.py), both versions."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.config import FLOAT32_MAX


# ---------------------------------------------------------------------- a scale on a bound float32 cannot hold
@pytest.mark.parametrize("bounds, init", [((1e-4, FLOAT32_MAX), 1e-4), ((1.0, 1e20), 1e20), ((1e-4, 1e20), 1e-4),
                                          ((0.1, 2.0**16), 0.1)], ids=["min-1e-4", "max-1e20", "both", "min-0.1"])
def test_a_state_dict_whose_scale_sits_on_a_bound_float32_rounds_loads_back_exactly(bounds, init):
    low, high = bounds
    with amp.fp16_emulation(paddle.nn.Linear(2, 2)):  # loss scaling on (a CPU turns it off outside)
        scaler = amp.GradScaler(init_loss_scaling=init, min_loss_scaling=low, max_loss_scaling=high)
        state = scaler.state_dict()
        assert state["scale"].dtype == np.float32 and float(state["scale"][0]) != init, "premise: float32 rounds it"
        back = amp.GradScaler(min_loss_scaling=low, max_loss_scaling=high)
        back.load_state_dict(state)
        assert back.loss_scale == init
    assert back.state_dict()["min_loss_scaling"] == low
    assert back.state_dict()["max_loss_scaling"] == high


def test_nan_steps_in_the_rehearsal_that_bring_the_scale_to_its_minimum_leave_a_loadable_state():
    paddle.seed(0)
    layer = paddle.nn.Linear(3, 2)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=layer.parameters())
    with amp.fp16_emulation(layer):
        scaler = amp.GradScaler(init_loss_scaling=4e-4, min_loss_scaling=1e-4)
        for _ in range(3):  # 4e-4 -> 2e-4 -> 1e-4 -> 1e-4 (the bound)
            scaler.scale(layer(paddle.ones([2, 3])).sum() * float("nan")).backward()
            assert scaler.step(opt).skipped
            scaler.update()
            opt.clear_grad()
        assert scaler.loss_scale == 1e-4
        back = amp.GradScaler(min_loss_scaling=1e-4)
        back.load_state_dict(scaler.state_dict())
        assert back.loss_scale == 1e-4 and back.state_dict()["skipped_steps"] == 3


@pytest.mark.parametrize("scale", [9.0e-5, 2e20, np.float32(5e-5)], ids=["below-min", "above-max", "float32-below"])
def test_a_scale_beyond_a_bound_by_more_than_float32_rounding_is_still_refused(scale):
    state = amp.GradScaler(init_loss_scaling=1e-4, min_loss_scaling=1e-4, max_loss_scaling=1e20).state_dict()
    state["scale"] = np.array([scale], dtype=np.float64)
    with pytest.raises(ValueError, match=r"^Scaler state dict: init_loss_scaling="):
        amp.GradScaler(min_loss_scaling=1e-4, max_loss_scaling=1e20).load_state_dict(state)


@pytest.mark.parametrize("bound", [True, "1e-4", 10**400, None], ids=repr)
def test_a_bound_that_is_not_a_number_is_refused_not_snapped_to(bound):
    state = amp.GradScaler(init_loss_scaling=1.0, min_loss_scaling=1e-4).state_dict()
    state["min_loss_scaling"] = bound
    with pytest.raises((TypeError, ValueError), match=r"^Scaler state dict: min_loss_scaling"):
        amp.GradScaler(min_loss_scaling=1e-4).load_state_dict(state)
