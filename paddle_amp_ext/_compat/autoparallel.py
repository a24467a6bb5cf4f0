"""Auto-parallel DistTensors (``dist.shard_tensor``/``shard_layer``/``parallelize``): what they hold here.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1, read in their sources and run with 2
processes on a CPU, gloo, eager mode):

- ``Tensor.is_dist()``, ``Tensor.placements`` (``Shard``/``Replicate``/``Partial``, each with
  ``is_partial()`` and ``is_replicated()``), ``Tensor.process_mesh`` and ``Tensor._local_value()``:
  this rank's own dense piece of a DistTensor, sharing its storage (an in-place change of it changes the
  DistTensor). The local value of a ``Replicate`` tensor is the global value; of a ``Partial``
  one, this rank's addend (a data-parallel loss is ``Partial(AVG)`` on 3.3.1: the local value is
  the rank's own loss); of a ``Shard``, its shard.
- ``dist.reshard(t, mesh, placements)``: Paddle's collective, entered by every rank of the mesh.
- A ``paddle.distributed`` collective (``all_reduce``...) on a DistTensor segfaults (the process
  group takes it for a DenseTensor): never pass one; a value computed from DistTensors by
  Paddle's SPMD rules (the global norm, ``isfinite`` of it) is already global.
- 2.6.2's in-place ``_C_ops.multiply_`` of a ``Partial`` DistTensor by a replicated factor is
  wrong (it multiplied by 29.18 instead of 0.5); 2.6.2's out-of-place ``paddle.multiply``
  reshards the ``Partial`` tensor to ``Replicate`` first (as its ``ClipGradByGlobalNorm`` does)
  and ``paddle.assign(x, output=grad)`` writes into the gradient the optimizer reads (for a
  ``Shard`` gradient that write all-gathers it: its in-place multiply is exact and is used). On 3.3.1
  the in-place multiply is exact (it scales the local addend, as 3.3.1's out-of-place one does),
  but ``paddle.assign(x, output=dist_tensor)`` leaves the DistTensor unchanged; ``copy_`` writes.
- ``_C_ops.check_finite_and_unscale_(grads, scale)`` on DistTensor gradients (the kernel
  ``dist.shard_scaler`` calls, with a dense scale): divides them in place and returns found_inf
  as a DistTensor. On 3.3.1 a ``Shard`` gradient stays a shard (no collective) and the flag is
  ``Partial(MAX)`` (reduced by the reshard that reads it); a ``Partial`` gradient is all-reduced
  first (one collective each) and left ``Replicate``. On 2.6.2 every ``Shard`` gradient is
  all-gathered and every ``Partial`` one all-reduced first (one collective each), the flag is
  ``Replicate`` and the same on every rank (an inf only in rank 1's shard: True on rank 0 too),
  and a ``Shard`` gradient comes back labelled ``Replicate`` while its local value is still the
  shard. On a CPU that kernel is the CPU one (zeroes from the first non-finite tensor on), so
  :func:`check_finite_and_unscale_` runs it on a GPU only. Paddle's own ``GradScaler._unscale``
  (``_legacy_C_ops.check_finite_and_unscale``) refuses DistTensors.
- Multiplying a DistTensor's local value in place scales the DistTensor (its storage): exact for
  ``Shard``/``Replicate``; for a ``Partial(SUM)`` one each rank scales its addend, the sum of
  the scaled addends (the addends [1, 2] and [3, 5] times 0.25 gave [1, 1.75] on both versions).
  That is not what a GPU's step does with one (Paddle's kernel reduces it first, and the clip
  then scales a replicated gradient: a clipped data-parallel step differed by 8e-8 relative),
  and a gradient left ``Partial`` is reduced again by the clip and the optimizer (9 collectives
  a step instead of 4 for the data-parallel MLP of the tests, 3.3.1), so a ``Partial`` gradient
  is reduced in place first (:func:`reduce_partial_`). Writing a reduced value into a
  ``Partial`` gradient: on 2.6.2 ``paddle.assign(x, output=grad)`` (the gradient becomes
  ``Replicate``, also as the parameter's ``_grad_ivar()`` sees it); on 3.3.1 ``paddle.assign``
  writes the reduced value into each rank's addend and keeps ``Partial`` (a sum of 2x), and
  ``_share_underline_tensor_to``/``_set_impl`` change only the Python wrapper, not the
  parameter's gradient; an in-place ``_C_ops.scale_(grad, 1.0, -0.0, True)`` (the identity,
  bit for bit, -0.0 and NaN included, float16/bfloat16/float32/float64) reduces it by its SPMD
  rule (one all-reduce) and leaves the parameter's gradient ``Replicate``.
- A DistTensor built from each rank's own dense value, with no collective: 3.3.1's
  ``paddle.distributed.auto_parallel.api.dtensor_from_local(local, mesh, placements)``; 2.6.2
  has none, and its own ``load_state_dict`` code builds one as ``paddle.Tensor(zeros,
  process_mesh=, placements=)`` and assigns the local value into ``_local_value()``. A bool
  ``Partial(MAX)`` flag built so (False on rank 0, True on rank 1) read True on both ranks
  after ``dist.reshard`` to ``Replicate`` (one all-reduce), on both versions.
- A DistTensor's ``data_ptr()`` is its local value's, while its ``shape`` is the global one: a
  kernel of ours that reads or writes memory through ``data_ptr()`` must take the element count
  from the local value (:func:`local_value`), or it runs past the local buffer. A new tensor to
  write a local result into is :func:`zeros_like`: 2.6.2's ``_C_ops.empty_like`` and
  ``_C_ops.assign`` of a ``Shard`` DistTensor return a ``Replicate`` one with a global-size local
  buffer (3.3.1's keep the placements); ``paddle.zeros_like`` keeps ``Shard`` and ``Replicate``
  placements on both (``empty_like``, ``zeros_like``, ``full_like``, ``scale`` of a ``Partial`` one
  give a ``Replicate`` one on both, checked); 2.6.2's
  ``_C_ops.sum`` of a ``Partial`` one claims ``Replicate`` but holds the sum of this rank's
  addend only (3.3.1's is reduced): reduce it first (:func:`replicated`). 2.6.2 lists the
  placements of a tensor :func:`replicated` returns as ``[]``.
- A data-dependent branch on a DistTensor must go the same way on every rank: on 2.6.2 even an
  element-wise ``paddle.where`` of two ``Shard(1)`` DistTensors all-gathers and splits again (a
  collective); a rank that enters it alone pairs its messages with the other rank's next
  collective (gloo: ``op.preamble.length <= op.nbytes``, or a timeout).
- ``dist.enable_auto_dp()`` (3.x; 2.6.2 has none, read in its sources: no ``auto_dp_utils``):
  auto-dp mode, which PaddleFormers' ``Trainer(enable_auto_parallel=True)`` always turns on.
  ``paddle.distributed.auto_parallel.auto_dp_utils.in_auto_dp_mode()`` says whether it is on
  (False in one process). Each rank then feeds its own batch, and each rank's gradient is its
  own unreduced addend while its placement claims ``Replicate`` (a dense gradient is one too):
  ``Optimizer._apply_optimize`` relabels it ``Partial`` (``_convert_fake_replicate_grad_to_partial``,
  placement 0, or a ``Partial`` DistTensor on a world mesh for a dense one) before the clip and
  the update, whose SPMD rules reduce it. A flag or norm computed from such a gradient before
  the step is this rank's own, whatever its label says (checked on 3.3.1, 2 processes: an inf
  only in rank 1's addend left rank 0's flag False).
- ``dist.shard_scaler`` (3.x only) replaces the scaler's ``_unscale`` by a bound function of
  ``paddle.distributed.auto_parallel.api`` whose found_inf is reduced over the meshes (Paddle's
  reshards): a found_inf it stores is already agreed.
"""

from __future__ import annotations

from typing import Any

import paddle

from .cuda_unscale import unscale_as_cuda
from .tracer import PADDLE_VERSION

_INPLACE_PARTIAL_IS_WRONG = PADDLE_VERSION < (3,)
_SHARD_SCALER_MODULE = "paddle.distributed.auto_parallel"


def is_dist(value: Any) -> bool:
    """Whether ``value`` is an auto-parallel DistTensor (False for dense tensors and non-tensors)."""
    return isinstance(value, paddle.Tensor) and bool(value.is_dist())


def auto_dp_enabled() -> bool:
    """Whether ``dist.enable_auto_dp()`` is on with more than one process (False on 2.6.2, which
    has no auto-dp). A module attribute read: no collective, no sync."""
    utils = getattr(paddle.distributed.auto_parallel, "auto_dp_utils", None)
    return utils is not None and bool(utils.in_auto_dp_mode())


def is_partial(tensor: paddle.Tensor) -> bool:
    """Whether a DistTensor holds a pending reduction (a ``Partial`` placement)."""
    return any(placement.is_partial() for placement in tensor.placements)


def local_value(value: Any) -> Any:
    """This rank's own dense piece of a DistTensor (no collective, no copy); anything else as it is."""
    return value._local_value() if is_dist(value) else value


def replicated(value: Any) -> Any:
    """A DistTensor with its pending reductions done (``Partial`` -> ``Replicate``, Paddle's
    reshard: a collective every rank of the mesh enters); anything else as it is."""
    if not is_dist(value) or not is_partial(value):
        return value
    placements = [paddle.distributed.Replicate() if p.is_partial() else p for p in value.placements]
    return paddle.distributed.reshard(value, value.process_mesh, placements)


def zeros_like(tensor: paddle.Tensor) -> paddle.Tensor:
    """A new float32 tensor shaped and placed like ``tensor`` (a DistTensor keeps its mesh and its
    ``Shard``/``Replicate`` placements, with a local buffer of its own local shape), of zeros."""
    return paddle.zeros_like(tensor, dtype=paddle.float32)


def same_on_every_rank(tensor: paddle.Tensor) -> bool:
    """Whether every rank's local value of a DistTensor is its whole global value (only
    ``Replicate`` placements), so a decision read from it needs no collective."""
    return all(placement.is_replicated() for placement in tensor.placements)


def multiply_(grad: paddle.Tensor, factor: paddle.Tensor) -> None:
    """``grad *= factor`` for a DistTensor gradient, as Paddle's ``ClipGradByGlobalNorm`` scales it
    on this version: in place, but a ``Partial`` one on 2.6 out of place (reduced first, as
    Paddle's clip does), then written back (writing back a ``Shard`` one would all-gather it)."""
    if _INPLACE_PARTIAL_IS_WRONG and is_partial(grad):
        paddle.assign(paddle.multiply(grad, factor), output=grad)
    else:
        paddle._C_ops.multiply_(grad, factor)


def assign_(src: paddle.Tensor, dst: paddle.Tensor) -> None:
    """Write ``src`` (Paddle's clip's output) into the DistTensor gradient ``dst`` the optimizer reads."""
    if _INPLACE_PARTIAL_IS_WRONG:
        paddle.assign(src, output=dst)
        return
    if is_dist(src) and list(src.placements) != list(dst.placements):
        src = paddle.distributed.reshard(src, dst.process_mesh, dst.placements)
    dst.copy_(src, False)


def shard_scaled(scaler: Any) -> bool:
    """Whether ``dist.shard_scaler`` replaced ``scaler._unscale`` (its found_inf is agreed)."""
    func = getattr(getattr(scaler, "__dict__", {}).get("_unscale"), "__func__", None)
    return func is not None and getattr(func, "__module__", "").startswith(_SHARD_SCALER_MODULE)


def check_finite_and_unscale_(grads: list, scale: paddle.Tensor) -> paddle.Tensor:
    """Divide DistTensor gradients by ``scale`` in place; return found_inf, a flag every rank of
    the mesh reads the same (once :func:`replicated`).

    On a CPU, as Paddle's kernel on a GPU: a ``Partial`` gradient is reduced first, in place
    (:func:`reduce_partial_`: one all-reduce each, as Paddle's kernel makes; it is ``Replicate``
    afterwards, as there), then the arithmetic of Paddle's CUDA kernel
    (:func:`.cuda_unscale.unscale_as_cuda`) runs on each gradient's local value (in place: it
    shares the DistTensor's storage), with no collective: every finite value divided by the
    scale, inf/nan kept where they were (Paddle's CPU kernel zeroes from the first non-finite
    tensor on). A ``Shard`` gradient stays a shard. found_inf is built from this rank's local
    flag: ``Partial(MAX)`` over each mesh dimension of more than one rank where a gradient is
    ``Shard`` (the one reshard that reads it, :func:`replicated`, is one all-reduce of a bool,
    entered by every rank at the same point), ``Replicate`` elsewhere (a replicated gradient is
    the same on every rank): the collectives of Paddle's kernel on 3.3.1. On a GPU, Paddle's
    kernel, as ``dist.shard_scaler`` runs it (one launch per float16, bfloat16 and other group;
    see the module docstring for its collectives). No device-to-host read.

    Args:
        grads: DistTensor gradients of one ``ProcessMesh`` (dense ones pass through as themselves).
        scale: the loss scale, a 1-element dense tensor or a DistTensor (its local value is used).

    Returns:
        A ``[1]`` bool DistTensor; a dense False flag for no gradients.

    Raises:
        ValueError: on a CPU, gradients on more than one ``ProcessMesh``.
    """
    scale = local_value(scale)
    if not grads:
        return paddle.to_tensor([False])
    if not local_value(grads[0]).place.is_cpu_place():
        return _paddle_kernel(grads, scale)
    dist_grads = [g for g in grads if is_dist(g)]
    mesh = dist_grads[0].process_mesh if dist_grads else None
    for grad in dist_grads:
        if grad.process_mesh != mesh:
            raise ValueError(f"DistTensor gradients on more than one ProcessMesh: {mesh} and {grad.process_mesh}. "
                             "The package unscales the gradients of one mesh on a CPU; wrap the scaler with "
                             "dist.shard_scaler (Paddle 3.x), which unscales them mesh by mesh.")
    for grad in dist_grads:
        reduce_partial_(grad)
    found = unscale_as_cuda([local_value(g) for g in grads], scale)
    if mesh is None:
        return found
    return from_local(found, mesh, _flag_placements(dist_grads, mesh))


@paddle.no_grad()
def reduce_partial_(grad: paddle.Tensor) -> None:
    """Do a DistTensor gradient's pending ``Partial`` reductions in place (one all-reduce, every
    rank of the mesh enters it): afterwards it is ``Replicate`` there, also as its parameter's
    ``_grad_ivar()`` reads it, as Paddle's ``check_finite_and_unscale_`` kernel leaves it.
    Anything else is left alone."""
    if not is_dist(grad) or not is_partial(grad):
        return
    if _INPLACE_PARTIAL_IS_WRONG:  # 2.6: assign writes the value and its placements
        paddle.assign(replicated(grad), output=grad)
    else:  # 3.x: the identity, whose SPMD rule reduces its input first
        paddle._C_ops.scale_(grad, 1.0, -0.0, True)


def _flag_placements(grads: list, mesh: Any) -> list:
    """Per mesh dimension: ``Partial(MAX)`` where a gradient's local value differs across its
    ranks (``Shard``/``Partial`` over more than one rank), ``Replicate`` elsewhere."""
    placements = []
    for dim, size in enumerate(mesh.shape):
        differs = size > 1 and any(not g.placements[dim].is_replicated() for g in grads)
        placements.append(paddle.distributed.Partial(paddle.distributed.ReduceType.kRedMax) if differs
                          else paddle.distributed.Replicate())
    return placements


def from_local(local: paddle.Tensor, mesh: Any, placements: list) -> paddle.Tensor:
    """A DistTensor whose local value on this rank is (a copy of, on 2.6.2) the dense ``local``:
    no collective, every rank of ``mesh`` builds its own. ``Partial(MAX)`` placements make the
    global value the maximum of the ranks' locals (reduced when read, by Paddle's reshard)."""
    make = getattr(paddle.distributed.auto_parallel.api, "dtensor_from_local", None)
    if make is not None:  # 3.x
        return make(local, mesh, placements)
    out = paddle.Tensor(paddle.zeros_like(local), process_mesh=mesh, placements=placements)  # 2.6.2
    paddle.assign(local, output=out._local_value())
    return out


def _paddle_kernel(grads: list, scale: paddle.Tensor) -> paddle.Tensor:
    """Paddle's ``check_finite_and_unscale_`` on DistTensors, one launch per float16, bfloat16
    and other group; the flags OR-ed. (``dist.shard_scaler`` launches float16 and bfloat16
    together, which the kernel refuses when both occur: "The data_type of input tensor in list
    isn't consistent", 3.3.1.)"""
    fp16 = [g for g in grads if g.dtype == paddle.float16]
    bf16 = [g for g in grads if g.dtype == paddle.bfloat16]
    other = [g for g in grads if g.dtype not in (paddle.float16, paddle.bfloat16)]
    found = None
    for group in (fp16, bf16, other):
        if group:
            _, flag = paddle._C_ops.check_finite_and_unscale_(group, scale)
            found = flag if found is None else paddle._C_ops.bitwise_or(found, flag)
    return found
