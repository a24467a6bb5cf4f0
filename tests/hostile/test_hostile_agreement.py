"""Where the skip decision needs a collective, in one process with the world size faked to 2:
``flags_agree``, ``agree_found_inf(flag, optimizer)``, fleet's unscale that the clip's norm can
replace, and ``_compat.unscale(own=True)``.

The multi-process behaviour (a NaN in one rank's batch, a ``no_sync`` gradient, fleet's
sharding with loss scaling on) is tested with real launches in tests/test_distributed.py and
tests/test_fleet.py.
"""

from __future__ import annotations

import types

import numpy as np
import paddle
import paddle.distributed as dist
import pytest
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import GroupShardedScaler

import paddle_amp_ext as amp
from paddle_amp_ext import _compat
from paddle_amp_ext._compat import fleet as compat_fleet
from paddle_amp_ext.distributed import agree_found_inf, flags, flags_agree


def _sgd(*layers):
    return paddle.optimizer.SGD(learning_rate=0.1, parameters=[p for layer in layers for p in layer.parameters()])


@pytest.fixture
def two_ranks(monkeypatch):
    """The world size faked to 2 and paddle.distributed.all_reduce counted (it leaves the flag alone)."""
    calls = []
    monkeypatch.setattr(flags, "_world", lambda: 2)
    monkeypatch.setattr(paddle.distributed, "all_reduce", lambda tensor, **kwargs: calls.append(kwargs))
    return calls


def test_a_plain_data_parallel_optimizer_agrees_without_a_collective(two_ranks):
    opt = _sgd(paddle.nn.Linear(2, 3), paddle.nn.Linear(3, 1))
    assert flags_agree(opt) is True
    flag = paddle.to_tensor([True])
    assert agree_found_inf(flag, opt) is flag
    assert two_ranks == []


@pytest.mark.parametrize("mark", ["no_sync", "is_distributed"])
def test_a_parameter_the_all_reduce_leaves_alone_needs_one_all_reduce(two_ranks, mark):
    expert = paddle.nn.Linear(3, 1)
    setattr(expert.weight, mark, True)
    opt = _sgd(paddle.nn.Linear(2, 3), expert)
    assert flags_agree(opt) is False
    agreed = agree_found_inf(paddle.to_tensor([True]), opt)
    assert len(two_ranks) == 1 and two_ranks[0]["op"] == paddle.distributed.ReduceOp.MAX
    assert agreed.dtype == paddle.bool and bool(agreed.numpy().reshape(-1)[0]) is True


def test_without_an_optimizer_the_flag_is_always_agreed(two_ranks):
    agree_found_inf(paddle.to_tensor([False]))
    agree_found_inf(False, None)
    assert len(two_ranks) == 2


@pytest.mark.parametrize("thing", [object(), types.SimpleNamespace(_parameter_list=None, step=lambda: None), 42])
def test_an_object_without_paddles_parameters_agrees_to_be_safe(two_ranks, thing):
    expected = isinstance(thing, types.SimpleNamespace)  # an empty parameter list: nothing can differ
    assert flags_agree(thing) is expected
    agree_found_inf(paddle.to_tensor([True]), thing)
    assert len(two_ranks) == (0 if expected else 1)


def test_a_stage3_optimizer_needs_the_agreement(two_ranks):
    opt = _sgd(paddle.nn.Linear(2, 1))
    opt._optim, opt._group = opt, object()  # what group_sharded_parallel(level="p_g_os") sets
    assert flags_agree(opt) is False
    agree_found_inf(paddle.to_tensor([True]), opt)
    assert len(two_ranks) == 1


def test_disttensor_parameters_agree_without_a_collective(two_ranks):
    mesh = dist.ProcessMesh([0], dim_names=["x"])
    layer = dist.shard_layer(paddle.nn.Linear(2, 1), mesh)
    assert flags_agree(_sgd(layer)) is True


def test_the_scalers_step_under_data_parallel_runs_no_collective(two_ranks):
    """Loss scaling off (the guard) with and without a clip: no found_inf all-reduce where the
    gradients were reduced in backward; one where a parameter is no_sync."""
    model = paddle.nn.Sequential(paddle.nn.Linear(2, 3), paddle.nn.Linear(3, 1))
    opt = _sgd(model)
    scaler = amp.GradScaler(enable=False)
    for clip in (None, 1.0):
        (model(paddle.ones([4, 2])).sum() * float("nan")).backward()
        assert scaler.step(opt, grad_clip=clip).skipped is True
        scaler.update()
        opt.clear_grad()
    assert two_ranks == []
    model[1].weight.no_sync = True
    model(paddle.ones([4, 2])).sum().backward()
    assert scaler.step(opt).skipped is False
    assert len(two_ranks) == 1


def test_only_a_plain_scaler_unscales_without_fleets_collective():
    scaler = amp.GradScaler()
    assert compat_fleet.unscale_needs_no_collective(scaler) is True
    GroupShardedScaler(scaler)  # its _unscale reduces over the sharding group and keeps its own set
    assert compat_fleet.unscale_needs_no_collective(scaler) is False
    other = amp.GradScaler()
    other._unscale = types.MethodType(lambda self, optimizer: None, other)  # someone else's: kept
    assert compat_fleet.unscale_needs_no_collective(other) is False
    assert compat_fleet.unscale_needs_no_collective(object()) is True  # no __dict__, no instance _unscale


def test_unscale_own_divides_exactly_and_leaves_an_instance_unscale_uncalled():
    model = paddle.nn.Linear(3, 2)
    opt = _sgd(model)
    scaler = amp.GradScaler(init_loss_scaling=1000.0)

    def refuse(self, optimizer):
        raise AssertionError("own=True must not run the instance's _unscale")

    scaler._unscale = types.MethodType(refuse, scaler)
    (model(paddle.ones([2, 3])).sum() * 1000.0).backward()
    grads = [_compat.grad_of(p) for p in model.parameters()]
    expected = [g.numpy() / np.float32(1000.0) for g in grads]
    with paddle.no_grad():  # the first tensor inf: the later ones are still divided (the CUDA kernel's rule)
        grads[0].multiply_(paddle.to_tensor(float("inf")))
    found = _compat.unscale(scaler, opt, grads, own=True)
    assert bool(found.numpy().reshape(-1)[0]) is True
    assert np.isinf(grads[0].numpy()).all()
    np.testing.assert_allclose(grads[1].numpy(), expected[1], rtol=1e-7)
    assert _compat.optimizer_stage(scaler, opt) == "UNSCALED"
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        _compat.unscale(scaler, opt, grads, own=True)


@pytest.fixture
def fleet_sharding_mode(monkeypatch):
    """What fleet.distributed_scaler reads, as fleet.init with sharding leaves it (one process)."""
    from paddle.distributed import fleet
    from paddle.distributed.fleet.base.topology import ParallelMode

    overlap = types.SimpleNamespace(comm_overlap=False)
    monkeypatch.setattr(fleet.fleet, "_hcg", types.SimpleNamespace(
        get_parallel_mode=lambda: ParallelMode.SHARDING_PARALLEL), raising=False)
    monkeypatch.setattr(fleet.fleet, "_user_defined_strategy", types.SimpleNamespace(
        hybrid_configs={"sharding_configs": overlap}), raising=False)
    return overlap


def test_through_fleets_distributed_scaler_the_unscale_is_the_cuda_kernels(fleet_sharding_mode, two_ranks):
    """fleet.distributed_scaler's own unscale runs Paddle's kernel (on a CPU: zeros from the first
    inf/nan on) and all-reduces found_inf; the package runs the CUDA kernel's arithmetic and that
    one all-reduce itself; with sharding's comm_overlap on, fleet's own unscale runs."""
    from paddle.distributed import fleet

    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.Linear(4, 2))
    opt = _sgd(model)
    scaler = fleet.distributed_scaler(amp.GradScaler(init_loss_scaling=1024.0))
    assert "_unscale" in vars(scaler) and compat_fleet.unscale_needs_no_collective(scaler) is True
    with amp.fp16_emulation(model):
        scaler.scale(model(paddle.ones([2, 3])).sum()).backward()
        grads = [_compat.grad_of(p) for p in model.parameters()]
        expected = [g.numpy() / np.float32(1024.0) for g in grads]
        with paddle.no_grad():
            grads[0].multiply_(paddle.to_tensor(float("inf")))
        scaler.unscale_(opt)
        assert len(two_ranks) == 1 and two_ranks[0]["op"] == paddle.distributed.ReduceOp.MAX  # fleet's one
        assert np.isinf(grads[0].numpy()).all()
        for grad, want in zip(grads[1:], expected[1:]):  # divided, not zeroed
            np.testing.assert_array_equal(grad.numpy(), want.astype(grad.numpy().dtype))
        assert scaler.step(opt).skipped is True
        scaler.update()
    fleet_sharding_mode.comm_overlap = True
    assert compat_fleet.unscale_needs_no_collective(scaler) is False
