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
  as a DistTensor, ``Partial(MAX)`` on 3.3.1 where a gradient is sharded (reduced by the reshard
  that reads it), ``Replicate`` and already the same on every rank on 2.6.2. Paddle's own
  ``GradScaler._unscale`` (``_legacy_C_ops.check_finite_and_unscale``) refuses DistTensors.
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
- ``dist.shard_scaler`` (3.x only) replaces the scaler's ``_unscale`` by a bound function of
  ``paddle.distributed.auto_parallel.api`` whose found_inf is reduced over the meshes (Paddle's
  reshards): a found_inf it stores is already agreed.
"""

from __future__ import annotations

from typing import Any

import paddle

from .tracer import PADDLE_VERSION

_INPLACE_PARTIAL_IS_WRONG = PADDLE_VERSION < (3,)
_SHARD_SCALER_MODULE = "paddle.distributed.auto_parallel"


def is_dist(value: Any) -> bool:
    """Whether ``value`` is an auto-parallel DistTensor (False for dense tensors and non-tensors)."""
    return isinstance(value, paddle.Tensor) and bool(value.is_dist())


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
    """Divide DistTensor gradients by ``scale`` in place; return found_inf (a DistTensor, global
    once :func:`replicated`). One kernel per float16/bfloat16 and other group, as ``dist.shard_scaler``."""
    half = [g for g in grads if g.dtype in (paddle.float16, paddle.bfloat16)]
    other = [g for g in grads if g.dtype not in (paddle.float16, paddle.bfloat16)]
    scale = local_value(scale)
    found = None
    for group in (half, other):
        if group:
            _, flag = paddle._C_ops.check_finite_and_unscale_(group, scale)
            found = flag if found is None else paddle._C_ops.bitwise_or(found, flag)
    return found if found is not None else paddle.to_tensor([False])
