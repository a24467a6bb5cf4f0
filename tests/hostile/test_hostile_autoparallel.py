"""Hostile tests of the auto-parallel surface, in one process (a 1-rank ``ProcessMesh``), both Paddle versions.

``Layout``/``layout_of``, ``norm_covers_every_grad``, ``step_unless_nonfinite``, ``LocalNormClip``,
the DistTensor branches of ``all_reduce_max``/``host_bool``/``agree_found_inf``, the scaler, the
guard and the hook on DistTensor parameters, and ``_compat.autoparallel``. The 2-process runs are
tests/test_autoparallel.py. 2.6.2 has no ``dist.shard_scaler``; in one process its backward
refuses a ``Partial`` reduction (no endpoints), so the data here are ``Replicate``.
"""

from __future__ import annotations

import threading
from types import MethodType, SimpleNamespace

import numpy as np
import paddle
import paddle.distributed as dist
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat
from paddle_amp_ext._compat import autoparallel as ap
from paddle_amp_ext._compat import fleet as compat_fleet
from paddle_amp_ext._compat import scaler as compat_scaler
from paddle_amp_ext.distributed import (
    Layout,
    agree_found_inf,
    all_reduce_max,
    host_bool,
    layout_of,
    norm_covers_every_grad,
    step_unless_nonfinite,
)
from paddle_amp_ext.distributed import flags as flags_module
from paddle_amp_ext.distributed.norm import LocalNormClip

MESH = dist.ProcessMesh([0], dim_names=["x"])
HAS_SHARD_SCALER = hasattr(dist, "shard_scaler")


def model_and_opt(clip=None, lr=0.5):
    paddle.seed(0)
    model = dist.shard_layer(paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Linear(3, 2)), MESH)
    opt = dist.shard_optimizer(paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters(), grad_clip=clip))
    return model, opt


def backward(model, scale=1.0, seed=1):
    x = np.random.default_rng(seed).standard_normal((5, 4)).astype("float32") * scale
    loss = model(dist.shard_tensor(paddle.to_tensor(x), MESH, [dist.Replicate()])).pow(2).mean()
    loss.backward()
    return loss


def values(model) -> list:
    return [np.asarray(p.numpy()).copy() for p in model.parameters()]


def dist_flag(value: bool):
    return dist.shard_tensor(paddle.to_tensor([value]), MESH, [dist.Replicate()])


@pytest.fixture
def no_raw_collective(monkeypatch):
    """Any paddle.distributed collective fails the test (on a DistTensor it would segfault)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a raw paddle.distributed collective ran")

    for name in ("all_reduce", "broadcast", "all_gather", "reduce"):
        monkeypatch.setattr(paddle.distributed, name, refuse)


# ---------------------------------------------------------------- Layout


@pytest.mark.parametrize("kind", ["bogus", None, "", "Auto_Parallel", 3])
def test_layout_refuses_an_unknown_kind(kind):
    with pytest.raises(ValueError, match=r"Layout kind must be one of \('local', 'hybrid', 'group_sharded', "
                                         r"'auto_parallel', 'auto_dp'\)\. Received: kind="):
        Layout(kind)


def test_layout_of_disttensor_parameters_is_auto_parallel_with_the_mesh():
    _, opt = model_and_opt()
    layout = layout_of(opt)
    assert layout.kind == "auto_parallel" and layout.group == MESH
    assert layout.norm_is_global is True and layout.clips_in_step is False
    assert layout_of(opt._inner_opt).kind == "auto_parallel"  # the inner optimizer too


def test_layout_of_dense_and_empty_optimizers_is_local():
    dense = paddle.optimizer.SGD(learning_rate=0.1, parameters=paddle.nn.Linear(2, 2).parameters())
    assert layout_of(dense) == Layout("local") and layout_of(dense).norm_is_global is False
    empty = paddle.optimizer.SGD(learning_rate=0.1, parameters=paddle.nn.Linear(2, 2).parameters())
    empty._parameter_list = []
    assert layout_of(empty).kind == "local"
    assert layout_of(SimpleNamespace()).kind == "local"  # no Paddle attributes at all: no AttributeError


# ---------------------------------------------------------------- _compat.autoparallel


@pytest.mark.parametrize("value", [None, 1.0, True, "tensor", np.ones(2), [paddle.ones([1])]])
def test_non_tensors_are_not_dist_and_pass_through_unchanged(value):
    assert ap.is_dist(value) is False
    assert ap.local_value(value) is value and ap.replicated(value) is value


def test_a_dense_tensor_passes_through_unchanged():
    dense = paddle.ones([2])
    assert ap.is_dist(dense) is False
    assert ap.local_value(dense) is dense and ap.replicated(dense) is dense


def test_local_value_of_a_disttensor_shares_its_storage():
    tensor = dist.shard_tensor(paddle.ones([3]), MESH, [dist.Replicate()])
    local = ap.local_value(tensor)
    assert ap.is_dist(local) is False
    local.multiply_(paddle.to_tensor(2.0))
    np.testing.assert_array_equal(tensor.numpy(), [2.0, 2.0, 2.0])


def test_shard_scaled_is_false_for_objects_without_dunder_dict_or_a_foreign_unscale():
    assert ap.shard_scaled(object()) is False
    assert ap.shard_scaled(1) is False
    scaler = amp.GradScaler(enable=False)
    assert ap.shard_scaled(scaler) is False
    scaler._unscale = lambda optimizer: None  # a plain function, no __func__
    assert ap.shard_scaled(scaler) is False
    scaler._unscale = MethodType(lambda self, optimizer: None, scaler)  # bound, but from this module
    assert ap.shard_scaled(scaler) is False and compat_fleet.unscale_reduces_found_inf(scaler) is False


@pytest.mark.skipif(not HAS_SHARD_SCALER, reason="Paddle 2.6.2 has no dist.shard_scaler")
def test_shard_scaler_is_known_to_agree_found_inf(no_raw_collective):
    scaler = dist.shard_scaler(amp.GradScaler(enable=False))
    assert ap.shard_scaled(scaler) is True and compat_fleet.unscale_reduces_found_inf(scaler) is True
    flag = paddle.to_tensor([True])  # even a dense flag: the shard_scaler's is already agreed
    assert agree_found_inf(flag, None, scaler=scaler) is flag


def test_check_finite_and_unscale_divides_exactly_and_flags_inf():
    grads = [dist.shard_tensor(paddle.to_tensor([2.0, 6.0]), MESH, [dist.Replicate()]),
             dist.shard_tensor(paddle.to_tensor([[8.0]]), MESH, [dist.Replicate()])]
    found = ap.check_finite_and_unscale_(grads, paddle.to_tensor([2.0]))
    assert host_bool(found) is False
    np.testing.assert_array_equal(grads[0].numpy(), [1.0, 3.0])
    np.testing.assert_array_equal(grads[1].numpy(), [[4.0]])
    bad = [dist.shard_tensor(paddle.to_tensor([1.0, float("inf")]), MESH, [dist.Replicate()])]
    assert host_bool(ap.check_finite_and_unscale_(bad, paddle.to_tensor([2.0]))) is True
    assert host_bool(ap.check_finite_and_unscale_([], paddle.to_tensor([2.0]))) is False


def dist_grad(values, dtype="float32", placement=None):
    """A DistTensor gradient on the 1-rank mesh (2.6.2 cannot split a float16 tensor: those are Replicate)."""
    tensor = paddle.to_tensor(np.asarray(values, dtype="float64" if dtype == "float64" else "float32")).astype(dtype)
    return dist.shard_tensor(tensor, MESH, [placement or dist.Replicate()])


def local(grad, dtype="float32") -> np.ndarray:
    """A gradient's value as numpy, read from its local value (on the 1-rank mesh, the global one;
    2.6.2 cannot read a Shard DistTensor's global value in one process: no endpoints)."""
    return ap.local_value(grad).astype(dtype).numpy()


def cuda_unscaled(values, scale: float, dtype: str = "float32") -> np.ndarray:
    """The CUDA kernel's rule, in numpy: x * (1 / scale), the reciprocal and product in float32,
    rounded to the gradient's dtype (bfloat16 by Paddle's cast, round-to-nearest-even as CUDA's)."""
    product = np.asarray(values, dtype="float32") * (np.float32(1) / np.float32(scale))
    return paddle.to_tensor(product).astype(dtype).astype("float32").numpy()


@pytest.mark.parametrize("nonfinite", [float("inf"), -float("inf"), float("nan")])
def test_unscale_after_a_nonfinite_first_gradient_divides_the_others_as_cuda(no_raw_collective, nonfinite):
    """Paddle's CPU kernel zeroed every gradient from the first non-finite one on (and made the inf
    a NaN); a GPU divides them all. Shard, Replicate and a second non-finite gradient later on."""
    grads = [dist_grad([[nonfinite, 2048.0], [6.0, 1.0]], placement=dist.Shard(0)),
             dist_grad([1024.0, -3.0, 5e-3]),
             dist_grad([[7.0, 0.5]], placement=dist.Shard(1)),
             dist_grad([float("nan"), 4096.0])]
    before = [local(g).copy() for g in grads]
    found = ap.check_finite_and_unscale_(grads, paddle.to_tensor([1024.0]))
    assert ap.is_dist(found) and found.dtype == paddle.bool and found.shape == [1]
    assert [p.is_replicated() for p in found.placements] == [True]  # a 1-rank mesh: no reduction pending
    assert host_bool(found) is True
    for grad, raw in zip(grads, before):
        np.testing.assert_array_equal(local(grad), raw / np.float32(1024.0))  # NaN where NaN, inf where inf
    assert [p.is_shard() for p in grads[0].placements] == [True]  # placements kept


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_unscale_of_each_dtype_rounds_as_cuda_with_a_non_power_of_two_scale(no_raw_collective, dtype):
    values = [[3.0, 1000.0, -7.0], [65504.0, 0.1, 2.0 ** -14]]
    placement = dist.Shard(0) if dtype in ("float32", "float64") else dist.Replicate()
    grads = [dist_grad([float("inf"), 1.0], dtype), dist_grad(values, dtype, placement)]
    scaled = [local(g).copy() for g in grads]
    found = ap.check_finite_and_unscale_(grads, paddle.to_tensor([3.0]))
    assert host_bool(found) is True
    assert grads[1].dtype == getattr(paddle, dtype)
    if dtype == "float64":  # the product in float64 with the float64 reciprocal
        np.testing.assert_array_equal(local(grads[1], "float64"), np.asarray(values, "float64") * (1 / np.float64(3.0)))
    else:
        np.testing.assert_array_equal(local(grads[1]), cuda_unscaled(scaled[1], 3.0, dtype))
    if dtype == "float32":  # x * (1/3) is not x / 3 everywhere: the CUDA kernel's reciprocal shows
        assert not np.array_equal(local(grads[1]), scaled[1] / np.float32(3.0))
    np.testing.assert_array_equal(local(grads[0]), [float("inf"), cuda_unscaled([1.0], 3.0, dtype)[0]])


def test_unscale_of_finite_mixed_dtypes_keeps_found_false(no_raw_collective):
    grads = [dist_grad([2.0, -4.0], "float16"), dist_grad([6.0], "bfloat16"),
             dist_grad([[8.0, 1.0]], placement=dist.Shard(1))]
    found = ap.check_finite_and_unscale_(grads, paddle.to_tensor([2.0]))
    assert ap.is_dist(found) and host_bool(found) is False
    assert [local(g).tolist() for g in grads] == [[1.0, -2.0], [3.0], [[4.0, 0.5]]]


def test_the_gpu_path_launches_paddles_kernel_once_per_dtype_group(monkeypatch, no_raw_collective):
    """Paddle's kernel checks that a launch's tensors share one dtype (kernel_dispatch.cc, before
    any backend): float16 with bfloat16 in one launch, as dist.shard_scaler makes it, is refused.
    Its CPU kernel has no float16/bfloat16 version, so the launches are recorded, not run."""
    launches = []

    def kernel(group, scale):
        launches.append([g.dtype for g in group])
        return group, dist_flag(len(launches) == 2)

    monkeypatch.setattr(paddle._C_ops, "check_finite_and_unscale_", kernel)
    grads = [dist_grad([2.0], "float16"), dist_grad([6.0]), dist_grad([6.0], "bfloat16"), dist_grad([1.0], "float16")]
    assert host_bool(ap._paddle_kernel(grads, paddle.to_tensor([2.0]))) is True  # the flags OR-ed
    assert launches == [[paddle.float16, paddle.float16], [paddle.bfloat16], [paddle.float32]]


def partial_grads():
    """A data-parallel backward on the 1-rank mesh (Shard(0) data): Partial gradients (3.x)."""
    paddle.seed(0)
    model = dist.shard_layer(paddle.nn.Linear(4, 2), MESH)
    x = np.random.default_rng(1).standard_normal((4, 4)).astype("float32") * 100
    model(dist.shard_tensor(paddle.to_tensor(x), MESH, [dist.Shard(0)])).pow(2).mean().backward()
    return model.parameters()


@pytest.mark.skipif(not HAS_SHARD_SCALER, reason="Paddle 2.6.2 cannot reduce a Partial DistTensor in one process")
def test_a_partial_gradient_is_reduced_in_place_then_unscaled_as_paddles_kernel_leaves_it(no_raw_collective):
    """As the kernel on a GPU: reduced first (the parameter's own gradient, the one the optimizer
    reads, becomes Replicate), then x * (1/3) in float32; -0.0 and NaN come through unchanged."""
    weight, bias = partial_grads()
    local_weight = ap.local_value(weight._grad_ivar())
    scaled = local(local_weight)
    scaled[0, :2] = [-0.0, float("nan")]
    paddle.assign(paddle.to_tensor(scaled), output=local_weight)
    grads = [weight._grad_ivar(), bias._grad_ivar()]
    assert all(p.is_partial() for g in grads for p in g.placements)
    before = [local(g).copy() for g in grads]
    found = ap.check_finite_and_unscale_(grads, paddle.to_tensor([3.0]))
    assert host_bool(found) is True
    for param, raw in zip((weight, bias), before):
        fresh = param._grad_ivar()
        assert [p.is_replicated() for p in fresh.placements] == [True]
        np.testing.assert_array_equal(local(fresh), cuda_unscaled(raw, 3.0))
    result = local(weight._grad_ivar())
    assert np.signbit(result[0, 0]) and np.isnan(result[0, 1])


@pytest.mark.skipif(not HAS_SHARD_SCALER, reason="Paddle 2.6.2 cannot reduce a Partial DistTensor in one process")
def test_reduce_partial_makes_the_parameters_own_gradient_replicate_and_leaves_others_alone():
    weight, _ = partial_grads()
    grad = weight._grad_ivar()
    value = local(grad).copy()
    ap.reduce_partial_(grad)
    fresh = weight._grad_ivar()
    assert [p.is_replicated() for p in fresh.placements] == [True]
    np.testing.assert_array_equal(local(fresh), value)
    ap.reduce_partial_(fresh)  # nothing pending: left alone
    np.testing.assert_array_equal(local(fresh), value)
    dense = paddle.ones([2])
    ap.reduce_partial_(dense)
    np.testing.assert_array_equal(dense.numpy(), [1.0, 1.0])


def test_unscale_of_no_gradients_is_a_dense_false_flag(no_raw_collective):
    found = ap.check_finite_and_unscale_([], paddle.to_tensor([1024.0]))
    assert ap.is_dist(found) is False and found.dtype == paddle.bool and host_bool(found) is False


def test_unscale_refuses_gradients_on_two_meshes_before_changing_any():
    here = dist_grad([2.0, 4.0])
    elsewhere = dist.shard_tensor(paddle.ones([2]), dist.ProcessMesh([1], dim_names=["x"]), [dist.Replicate()])
    with pytest.raises(ValueError, match=r"DistTensor gradients on more than one ProcessMesh: .*process_ids: \[0\].* "
                                         r"and .*process_ids: \[1\].*wrap the scaler with dist\.shard_scaler"):
        ap.check_finite_and_unscale_([here, elsewhere], paddle.to_tensor([2.0]))
    np.testing.assert_array_equal(local(here), [2.0, 4.0])


def test_the_flag_is_partial_max_only_where_a_gradient_differs_across_more_than_one_rank():
    mesh = dist.ProcessMesh([[0], [1]], dim_names=["a", "b"])  # 2 x 1: only dimension "a" has 2 ranks
    sharded = SimpleNamespace(placements=[dist.Shard(0), dist.Shard(1)])
    partial = SimpleNamespace(placements=[dist.Partial(), dist.Replicate()])
    replicated = SimpleNamespace(placements=[dist.Replicate(), dist.Replicate()])

    def kinds(grads):
        return [("max" if p == dist.Partial(dist.ReduceType.kRedMax) else
                 "replicate" if p.is_replicated() else "other") for p in ap._flag_placements(grads, mesh)]

    assert kinds([replicated, sharded]) == ["max", "replicate"]
    assert kinds([partial]) == ["max", "replicate"]
    assert kinds([replicated]) == ["replicate", "replicate"]


def test_scaler_unscale_routes_disttensor_gradients_to_the_cuda_rule(no_raw_collective):
    model, opt = model_and_opt()
    scaler = paddle.amp.GradScaler(enable=False)
    compat_scaler.init_scaler_state(scaler, 8.0)
    backward(model, scale=100.0)
    grads = [p._grad_ivar() for p in model.parameters()]
    first = local(grads[0])
    first[0, 0] = float("inf")  # an overflow in the first gradient the step applies
    paddle.assign(paddle.to_tensor(first), output=ap.local_value(grads[0]))
    before = [local(g).copy() for g in grads]
    found = compat_scaler.unscale(scaler, opt, grads)
    assert ap.is_dist(found) and host_bool(found) is True
    for grad, raw in zip(grads, before):
        np.testing.assert_array_equal(local(grad), raw / np.float32(8.0))
    assert compat_scaler.optimizer_stage(scaler, opt) == "UNSCALED"


@pytest.mark.parametrize("nonfinite", [float("nan"), float("inf"), -float("inf")])
def test_assign_grad_writes_into_a_disttensor_and_a_dense_tensor(nonfinite):
    target = dist.shard_tensor(paddle.zeros([2]), MESH, [dist.Replicate()])
    _compat.assign_grad(dist.shard_tensor(paddle.to_tensor([1.0, nonfinite]), MESH, [dist.Replicate()]), target)
    np.testing.assert_array_equal(target.numpy(), [1.0, nonfinite])
    dense = paddle.zeros([2])
    _compat.assign_grad(paddle.to_tensor([3.0, 4.0]), dense)
    np.testing.assert_array_equal(dense.numpy(), [3.0, 4.0])


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("world", [1, 2])
def test_a_disttensor_flag_is_never_given_to_a_raw_collective(monkeypatch, no_raw_collective, value, world):
    """With a default process group (world 2) the old path handed it to all_reduce: a segfault."""
    monkeypatch.setattr(flags_module, "_world", lambda: world)
    flag = dist_flag(value)
    agreed = all_reduce_max(flag)
    assert ap.is_dist(agreed) and host_bool(agreed) is value
    assert host_bool(agree_found_inf(flag, None)) is value


def test_a_dense_flag_still_takes_one_all_reduce_with_a_default_group(monkeypatch):
    calls = []
    monkeypatch.setattr(flags_module, "_world", lambda: 2)
    monkeypatch.setattr(paddle.distributed, "all_reduce", lambda tensor, op=None: calls.append(tensor))
    assert host_bool(all_reduce_max(paddle.to_tensor([True]))) is True and len(calls) == 1


# ---------------------------------------------------------------- norm_covers_every_grad / step_unless_nonfinite


def test_norm_covers_every_grad_only_for_a_global_norm_clip_over_all_parameters():
    model, opt = model_and_opt()
    params = list(model.parameters())
    by_norm = paddle.nn.ClipGradByGlobalNorm(1.0)
    assert norm_covers_every_grad(opt, by_norm, None, params) is True
    assert norm_covers_every_grad(opt, by_norm, params[:1], params) is False  # parameters=...
    assert norm_covers_every_grad(opt, paddle.nn.ClipGradByNorm(1.0), None, params) is False
    assert norm_covers_every_grad(opt, paddle.nn.ClipGradByValue(1.0), None, params) is False
    assert norm_covers_every_grad(opt, 1.0, None, params) is False  # not resolved: not a clip
    assert norm_covers_every_grad(opt, None, None, params) is False  # no clip at all
    params[0].need_clip = False
    assert norm_covers_every_grad(opt, by_norm, None, params) is False
    _, own = model_and_opt(clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    assert norm_covers_every_grad(own, None, None, list(model.parameters())[1:]) is True  # the optimizer's own


def test_step_unless_nonfinite_equals_paddles_clip_and_skips_nonfinite():
    reference, ref_opt = model_and_opt(clip=paddle.nn.ClipGradByGlobalNorm(0.01))
    backward(reference)
    ref_opt.step()
    model, opt = model_and_opt(clip=paddle.nn.ClipGradByGlobalNorm(0.01))
    own = _compat.fleet.current_clip(opt)
    backward(model)
    norm, skipped = step_unless_nonfinite(opt, None)
    assert skipped is False and float(ap.local_value(norm)) > 0.01
    assert all(np.array_equal(a, b) for a, b in zip(values(model), values(reference)))
    assert _compat.fleet.current_clip(opt) is own  # restored
    opt.clear_grad()
    before = values(model)
    backward(model, scale=float("nan"))
    norm, skipped = step_unless_nonfinite(opt, None)
    assert skipped is True and np.isnan(float(ap.local_value(norm)))
    assert all(np.array_equal(a, b) for a, b in zip(values(model), before))


def test_step_unless_nonfinite_restores_the_clip_when_the_step_raises(monkeypatch):
    model, opt = model_and_opt(clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    own = _compat.fleet.current_clip(opt)
    backward(model)

    def broken(*args, **kwargs):
        raise RuntimeError("step failed")

    monkeypatch.setattr(type(opt), "step", broken)
    with pytest.raises(RuntimeError, match="^step failed$"):
        step_unless_nonfinite(opt, None)
    assert _compat.fleet.current_clip(opt) is own


def test_local_norm_clip_of_nothing_and_measuring_only():
    clip = LocalNormClip(1.0)
    assert clip([]) == [] and clip.norm is None
    model, _ = model_and_opt()
    backward(model, scale=100.0)
    pairs = [(p, p._grad_ivar()) for p in model.parameters()]
    before = [np.asarray(g.numpy()).copy() for _, g in pairs]
    measure = LocalNormClip(None)
    assert measure(pairs) is pairs
    assert float(ap.local_value(measure.norm)) > 1.0
    assert all(np.array_equal(np.asarray(g.numpy()), b) for (_, g), b in zip(pairs, before))


# ---------------------------------------------------------------- scaler, guard, hook on DistTensor parameters


@pytest.mark.parametrize("grad_clip", [0.01, paddle.nn.ClipGradByGlobalNorm(0.01)])
def test_scaler_step_clips_disttensor_gradients_as_paddle(no_raw_collective, grad_clip):
    reference, ref_opt = model_and_opt(clip=paddle.nn.ClipGradByGlobalNorm(0.01))
    backward(reference)
    ref_opt.step()
    model, opt = model_and_opt()
    scaler = amp.GradScaler(enable=False)
    backward(model)
    result = scaler.step(opt, grad_clip=grad_clip)
    scaler.update()
    assert result.skipped is False and ap.is_dist(result.grad_norm)
    assert all(np.array_equal(a, b) for a, b in zip(values(model), values(reference)))


@pytest.mark.parametrize("nonfinite", [float("nan"), float("inf")])
def test_scaler_skips_nonfinite_disttensor_gradients_with_and_without_a_clip(no_raw_collective, nonfinite):
    for grad_clip in (None, 1.0):
        model, opt = model_and_opt()
        before = values(model)
        scaler = amp.GradScaler(enable=False)
        backward(model, scale=nonfinite)
        assert scaler.step(opt, grad_clip=grad_clip).skipped is True
        scaler.update()
        assert scaler.skipped_steps == 1
        assert all(np.array_equal(a, b) for a, b in zip(values(model), before))


def test_hooks_get_the_local_loss_and_norm_of_disttensors(no_raw_collective):
    seen = []
    model, opt = model_and_opt()
    scaler = amp.GradScaler(enable=False, hooks=[seen.append])
    x = dist.shard_tensor(paddle.ones([2, 4]), MESH, [dist.Replicate()])
    loss = model(x).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt, grad_clip=1.0)
    scaler.update()
    (event,) = seen
    assert ap.is_dist(event.loss) is False  # this rank's own value: reading it is no collective
    assert float(event.loss) == float(loss.numpy())


def test_visualdl_hook_writes_disttensor_values_without_a_collective(tmp_path, no_raw_collective):
    pytest.importorskip("visualdl")
    from visualdl import LogReader

    model, opt = model_and_opt()
    with amp.VisualDLHook(str(tmp_path), run_name="", flush_every=1) as hook:
        scaler = amp.GradScaler(enable=False, hooks=[hook])
        loss = backward(model)
        scaler.scale(loss)
        scaler.step(opt, grad_clip=1.0)
        norm = float(ap.local_value(scaler.last_result.grad_norm))
        scaler.update()
    (path,) = tmp_path.glob("vdlrecords.*")
    reader = LogReader(file_path=str(path))
    assert [d.value for d in reader.get_data("scalar", "amp/grad_norm")] == pytest.approx([norm], rel=1e-6)
    assert [d.value for d in reader.get_data("scalar", "amp/loss")] == pytest.approx([float(loss.numpy())], rel=1e-6)


def test_guard_on_a_shard_optimizer_wrapper_guards_it_and_leaves_the_inner_optimizer_alone():
    model, opt = model_and_opt()
    inner = opt._inner_opt
    guard = amp.guard_optimizer(opt)
    assert "step" in vars(opt) and "step" not in vars(inner)
    before = values(model)
    backward(model, scale=float("nan"))
    assert opt.step() is None and guard.last_step_skipped is True and guard.skipped_steps == 1
    assert all(np.array_equal(a, b) for a, b in zip(values(model), before))
    opt.clear_grad()
    backward(model)
    opt.step()
    assert guard.last_step_skipped is False and not all(np.array_equal(a, b) for a, b in zip(values(model), before))
    guard.remove()
    guard.remove()  # idempotent
    assert "step" not in vars(opt) and "step" not in vars(inner) and guard.active is False


def test_scaler_steps_disttensor_parameters_from_another_thread(no_raw_collective):
    model, opt = model_and_opt()
    scaler = amp.GradScaler(enable=False)
    results = []

    def train():
        backward(model)
        results.append(scaler.step(opt, grad_clip=1.0).skipped)
        scaler.update()

    thread = threading.Thread(target=train)
    thread.start()
    thread.join(timeout=60)
    assert results == [False]
