"""The distributed decisions in one process: which layout, no collective alone, fleet's patches."""

from __future__ import annotations

import paddle
import pytest
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import GroupShardedScaler

import paddle_amp_ext as amp
from paddle_amp_ext._compat import fleet as compat_fleet
from paddle_amp_ext.distributed import Layout, agree_found_inf, all_reduce_max, host_bool, layout_of


def _sgd(model):
    return paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())


def test_a_plain_optimizer_steps_locally():
    assert layout_of(_sgd(paddle.nn.Linear(2, 1))) == Layout("local")
    assert not Layout("local").clips_in_step


def test_a_stage3_optimizer_clips_in_its_step_over_its_group():
    opt = _sgd(paddle.nn.Linear(2, 1))
    group = object()
    opt._optim, opt._group = opt, group  # what group_sharded_parallel(level="p_g_os") sets
    assert layout_of(opt) == Layout("group_sharded", group)
    assert layout_of(opt).clips_in_step
    assert compat_fleet.base_optimizer(opt) is opt


def test_alone_the_flag_is_returned_without_a_collective(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no collective in a single process")

    monkeypatch.setattr(paddle.distributed, "all_reduce", refuse)
    flag = paddle.to_tensor([True])
    assert agree_found_inf(flag, None) is flag
    assert all_reduce_max(flag) is flag
    assert host_bool(flag) is True
    model = paddle.nn.Linear(2, 1)  # the scaler's guard with loss scaling off: no collective either
    opt = _sgd(model)
    scaler = amp.GradScaler(enable=False)
    (model(paddle.ones([1, 2])).sum() * float("nan")).backward()
    assert scaler.step(opt, grad_clip=1.0).skipped is True


def test_fleets_patched_unscale_is_recognised_as_already_agreed():
    scaler = amp.GradScaler()
    assert compat_fleet.unscale_reduces_found_inf(scaler) is False
    patched = GroupShardedScaler(scaler)  # Paddle's own: replaces _unscale, all-reduces found_inf
    assert patched is scaler and compat_fleet.unscale_reduces_found_inf(scaler) is True
    flag = paddle.to_tensor([False])
    assert agree_found_inf(flag, None, scaler=scaler) is flag


def test_the_old_names_stay_importable():
    from paddle_amp_ext import distributed

    assert distributed.all_reduce_max is all_reduce_max and distributed.host_bool is host_bool


@pytest.mark.parametrize("clip", [None, paddle.nn.ClipGradByGlobalNorm(1.0)])
def test_swapping_the_clip_for_one_step_restores_the_optimizers_own(clip):
    model = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters(), grad_clip=clip)
    undo = compat_fleet.swap_clip(opt, "probe")
    assert compat_fleet.current_clip(opt) == "probe"
    undo()
    assert compat_fleet.current_clip(opt) is clip
