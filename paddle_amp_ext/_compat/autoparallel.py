"""Auto-parallel DistTensors (``dist.shard_tensor``/``shard_layer``/``parallelize``): what they hold here.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1): ``Tensor.is_dist()``, ``placements``,
``process_mesh``, ``_local_value()``; ``dist.reshard``; ``_C_ops.check_finite_and_unscale_``,
``_C_ops.scale_``, ``_C_ops.sum``/``empty_like``/``assign`` on DistTensors; 3.3.1's
``dtensor_from_local`` (2.6.2: ``paddle.Tensor(..., process_mesh=, placements=)``);
``auto_dp_utils.in_auto_dp_mode()`` and ``dist.shard_scaler``'s ``_unscale`` (3.x). What each does
on each version, as measured, is in the auto-parallel guide ("How auto-parallel is read"). Never
pass a DistTensor to a ``paddle.distributed`` collective: it segfaults.
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
