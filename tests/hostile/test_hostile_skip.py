"""The skip strategies in one process: ``strategy_of`` picks one per layout, ``reduce_local_max`` takes
any flag, ``agree_found_inf`` asks the strategy, and the auto-dp strategy never trusts a label.

Auto-dp is on only with several processes (Paddle's ``in_auto_dp_mode``), so here it is faked
where the layout reads it (``_compat.autoparallel.auto_dp_enabled``); the real thing runs in
tests/test_autodp.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import paddle
import paddle.distributed as dist
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext._compat import autoparallel as ap
from paddle_amp_ext.distributed import Layout, SkipStrategy, agree_found_inf, flags, layout_of, strategy_of
from paddle_amp_ext.distributed import skip as skip_mod
from paddle_amp_ext.distributed.skip import (
    AutoDataParallel,
    AutoParallel,
    DataParallel,
    SingleProcess,
    reduce_local_max,
)

MESH = dist.ProcessMesh([0], dim_names=["dp"])


def _sgd(layer=None):
    layer = layer or paddle.nn.Linear(2, 1)
    return paddle.optimizer.SGD(learning_rate=0.1, parameters=layer.parameters())


@pytest.fixture
def auto_dp(monkeypatch):
    monkeypatch.setattr(ap, "auto_dp_enabled", lambda: True)


@pytest.fixture
def counted(monkeypatch):
    """paddle.distributed.all_reduce counted (it leaves the tensor alone)."""
    calls = []
    monkeypatch.setattr(paddle.distributed, "all_reduce", lambda tensor, **kwargs: calls.append(kwargs))
    return calls


# ---------------------------------------------------------------- strategy_of


def test_one_process_and_data_parallel_are_told_apart_by_the_world(monkeypatch):
    opt = _sgd()
    assert type(strategy_of(opt)) is SingleProcess
    monkeypatch.setattr(flags, "_world", lambda: 2)
    assert type(strategy_of(opt)) is DataParallel
    assert strategy_of(opt).layout == Layout("local")


@pytest.mark.parametrize("thing", [None, SimpleNamespace(), object(), 3, "adam"])
def test_anything_without_paddle_parameters_is_one_process(thing):
    strategy = strategy_of(thing)
    assert type(strategy) is SingleProcess and not strategy.clips_in_step and not strategy.norm_is_global


def test_disttensor_parameters_are_auto_parallel_and_auto_dp_overrides_it(auto_dp):
    model = dist.shard_layer(paddle.nn.Linear(2, 1), MESH)
    opt = _sgd(model)
    strategy = strategy_of(opt)
    assert type(strategy) is AutoDataParallel and strategy.layout == Layout("auto_dp", MESH)
    assert strategy.clips_in_step and strategy.own_clip_is_global and not strategy.norm_is_global
    assert "Replicate" in strategy.gradients and repr(strategy).startswith("AutoDataParallel(Layout(kind='auto_dp'")


def test_without_auto_dp_disttensors_are_auto_parallel():
    opt = _sgd(dist.shard_layer(paddle.nn.Linear(2, 1), MESH))
    strategy = strategy_of(opt)
    assert type(strategy) is AutoParallel and strategy.norm_is_global and not strategy.clips_in_step


def test_dense_parameters_under_auto_dp_are_auto_dp_on_the_world(auto_dp):
    opt = _sgd()
    assert layout_of(opt) == Layout("auto_dp", None)
    assert type(strategy_of(opt)) is AutoDataParallel


def test_auto_dp_is_off_in_one_process_whatever_was_enabled():
    assert ap.auto_dp_enabled() is False  # Paddle's in_auto_dp_mode is False with a world of 1; 2.6.2 has none


def test_the_base_strategy_decides_nothing():
    with pytest.raises(NotImplementedError):
        SkipStrategy(Layout("local")).agree(True, None)


def test_every_layout_kind_has_a_strategy_and_every_strategy_a_file():
    names = {cls.name for cls in skip_mod.select.STRATEGIES.values()}
    assert names == {"single", "data_parallel", "hybrid", "group_sharded", "auto_parallel", "auto_dp"}
    assert {cls.__module__.rsplit(".", 1)[1] for cls in skip_mod.select.STRATEGIES.values()} == {
        "single", "data_parallel", "hybrid", "group_sharded", "auto_parallel", "auto_dp"}


# ---------------------------------------------------------------- reduce_local_max


@pytest.mark.parametrize("flag, expected", [
    (True, True), (False, False), (0, False), (7, True), (float("nan"), True), (np.float32(0.0), False),
    (np.bool_(True), True),
])
def test_reduce_local_max_takes_every_kind_of_flag(flag, expected, counted):
    agreed = reduce_local_max(flag)
    assert ap.is_dist(agreed) and agreed.dtype == paddle.bool
    assert bool(agreed._local_value().numpy().reshape(-1)[0]) is expected
    assert counted == []  # the mesh's reshard, never a raw collective on a DistTensor


@pytest.mark.parametrize("value", [True, False])
def test_reduce_local_max_reads_the_local_value_of_a_replicate_labelled_disttensor(value):
    flag = dist.shard_tensor(paddle.to_tensor([value]), MESH, [dist.Replicate()])
    assert bool(reduce_local_max(flag, MESH)._local_value().numpy()[0]) is value
    float_flag = paddle.to_tensor([float("inf")])
    assert bool(reduce_local_max(paddle.logical_not(paddle.isfinite(float_flag)), MESH).numpy()[0]) is True


@pytest.mark.parametrize("flag, error, match", [
    ("yes", TypeError, "A found_inf flag must be a bool, int, float or a 1-element paddle.Tensor"),
    (None, TypeError, "Received: None"),
    ([True], TypeError, r"Received: \[True\]"),
    (paddle.to_tensor([True, False]), ValueError, r"exactly one element\. Received a tensor of shape \[2\]"),
    (paddle.zeros([0], dtype="bool"), ValueError, r"shape \[0\] \(0 elements\)"),
    (paddle.to_tensor([1 + 2j]), TypeError, "must be bool, int or float"),
])
def test_reduce_local_max_refuses_what_is_not_a_flag_before_any_collective(flag, error, match, counted):
    with pytest.raises(error, match=match):
        reduce_local_max(flag)
    assert counted == []


def test_reduce_local_max_from_threads_agrees_in_each():
    results = []

    def work(value):
        results.append((value, bool(reduce_local_max(value).numpy()[0])))

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [(False, False), (False, False), (True, True), (True, True)]


# ---------------------------------------------------------------- agree_found_inf and the scaler under auto-dp


def test_agree_found_inf_under_auto_dp_reduces_even_a_flag_the_scaler_claims_agreed(auto_dp, monkeypatch):
    """dist.shard_scaler's flag believes the Replicate label: auto-dp reduces it anyway."""
    from paddle_amp_ext._compat import fleet as compat_fleet
    monkeypatch.setattr(compat_fleet, "unscale_reduces_found_inf", lambda scaler: True)
    opt = _sgd(dist.shard_layer(paddle.nn.Linear(2, 1), MESH))
    reduced = []
    real = skip_mod.auto_dp.reduce_local_max
    monkeypatch.setattr(skip_mod.auto_dp, "reduce_local_max",
                        lambda flag, mesh=None: reduced.append(mesh) or real(flag, mesh))
    flag = dist.shard_tensor(paddle.to_tensor([True]), MESH, [dist.Replicate()])
    agreed = agree_found_inf(flag, opt, scaler=object())
    assert reduced == [MESH] and bool(agreed._local_value().numpy()[0]) is True
    assert agree_found_inf(flag, _sgd(), scaler=object()) is not flag  # dense parameters too: reduced


def test_a_scaler_under_auto_dp_clips_inside_the_step_and_skips_a_nan(auto_dp):
    """One process, auto-dp faked: the clip runs inside the step (after Paddle's relabel), the NaN
    step is skipped, the finite one clipped as Paddle's own clip does."""
    model = dist.shard_layer(paddle.nn.Linear(3, 2), MESH)
    opt = dist.shard_optimizer(paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters()))
    scaler = amp.GradScaler(enable=False)
    x = dist.shard_tensor(paddle.to_tensor(np.ones((2, 3), "float32")), MESH, [dist.Replicate()])
    model(x).sum().backward()
    before = [p.numpy().copy() for p in model.parameters()]
    result = scaler.step(opt, grad_clip=0.1)
    scaler.update()
    opt.clear_grad()
    assert result.skipped is False and result.grad_norm is not None
    moved = np.sqrt(sum(((p.numpy() - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    assert abs(moved - 0.5 * 0.1) < 1e-6  # lr times the clip norm: clipped inside the step
    (model(x).sum() * float("nan")).backward()
    after = [p.numpy().copy() for p in model.parameters()]
    assert scaler.step(opt, grad_clip=0.1).skipped is True
    scaler.update()
    assert all(np.array_equal(p.numpy(), a) for p, a in zip(model.parameters(), after))


# ---------------------------------------------------------------- the strategy given to the step functions


@pytest.mark.parametrize("strategy", ["auto_dp", 3, object(), Layout("auto_dp"), AutoDataParallel])
def test_the_step_functions_refuse_what_is_not_a_strategy_before_stepping(strategy):
    from paddle_amp_ext.distributed import step_clipped, step_unless_nonfinite

    layer = paddle.nn.Linear(2, 1)
    opt = _sgd(layer)
    layer(paddle.ones([1, 2])).sum().backward()
    before = layer.weight.numpy().copy()
    with pytest.raises(TypeError, match=r"strategy must be a SkipStrategy .* Received: "):
        step_unless_nonfinite(opt, paddle.nn.ClipGradByGlobalNorm(1.0), strategy)
    with pytest.raises(TypeError, match=r"strategy must be a SkipStrategy .* Received: "):
        step_clipped(opt, None, False, None, strategy)
    assert np.array_equal(layer.weight.numpy(), before)  # nothing stepped


def test_the_step_functions_take_the_strategy_they_are_given():
    """A strategy handed in decides the recorder: a single-process optimizer stepped with the
    auto-dp strategy clips through LocalNormClip, as the single-process one does."""
    from paddle_amp_ext.distributed import step_unless_nonfinite

    layer = paddle.nn.Linear(2, 1)
    opt = _sgd(layer)
    layer(paddle.ones([1, 2]) * float("inf")).sum().backward()
    before = layer.weight.numpy().copy()
    norm, skipped = step_unless_nonfinite(opt, paddle.nn.ClipGradByGlobalNorm(1.0),
                                          AutoDataParallel(Layout("auto_dp")))
    assert skipped is True and not np.isfinite(float(norm.numpy().reshape(-1)[0]))
    assert np.array_equal(layer.weight.numpy(), before)


def test_without_an_optimizer_a_disttensor_flag_under_auto_dp_is_reduced_from_its_local_value(auto_dp, monkeypatch):
    reduced = []
    real = skip_mod.select.reduce_local_max
    monkeypatch.setattr(skip_mod.select, "reduce_local_max",
                        lambda flag, mesh=None: reduced.append(mesh) or real(flag, mesh))
    flag = dist.shard_tensor(paddle.to_tensor([True]), MESH, [dist.Replicate()])
    assert bool(agree_found_inf(flag)._local_value().numpy()[0]) is True and reduced == [MESH]
    assert agree_found_inf(False) is False and reduced == [MESH]  # a host flag: as before (alone: itself)


@pytest.mark.parametrize("own_clip, reductions", [(True, 0), (False, 1)])
def test_the_guard_under_auto_dp_rides_on_the_optimizers_own_clip(auto_dp, monkeypatch, own_clip, reductions):
    """A guarded plain step() under auto-dp: with the optimizer's global-norm clip the decision is
    its in-step norm (no flag reduction); without one, the flag is reduced once. The NaN step is
    skipped either way."""
    reduced = []
    real = skip_mod.auto_dp.reduce_local_max
    monkeypatch.setattr(skip_mod.auto_dp, "reduce_local_max",
                        lambda flag, mesh=None: reduced.append(mesh) or real(flag, mesh))
    layer = dist.shard_layer(paddle.nn.Linear(3, 2), MESH)
    clip = paddle.nn.ClipGradByGlobalNorm(0.1) if own_clip else None
    opt = dist.shard_optimizer(paddle.optimizer.SGD(learning_rate=0.5, parameters=layer.parameters(), grad_clip=clip))
    x = dist.shard_tensor(paddle.to_tensor(np.ones((2, 3), "float32")), MESH, [dist.Replicate()])
    with amp.guard_optimizer(opt) as guard:
        (layer(x).sum() * float("nan")).backward()
        before = [p.numpy().copy() for p in layer.parameters()]
        assert opt.step() is None
        assert guard.last_step_skipped is True and guard.skipped_steps == 1
        assert all(np.array_equal(p.numpy(), b, equal_nan=True) for p, b in zip(layer.parameters(), before))
        opt.clear_grad()
        layer(x).sum().backward()
        opt.step()
        assert guard.last_step_skipped is False
        assert not all(np.array_equal(p.numpy(), b) for p, b in zip(layer.parameters(), before))
    assert len(reduced) == 2 * reductions
