"""Optimizer parameters, gradient tensors, the fused kernels of Paddle's clip, hapi's scaler.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1):

- ``Tensor._grad_ivar()``: the gradient tensor the optimizer really reads (``Tensor.grad`` is a
  copy-on-access view on both versions, so in-place clipping must go through this).
- ``param.main_grad``: the float32 master gradient. Fleet's ``MixPrecisionLayer``
  (``paddle.distributed.fleet.utils.mix_precision_utils``, PaddleNLP's and PaddleFormers'
  ``amp_master_grad=True``) sets it to None on every parameter it wraps and, from a gradient hook,
  accumulates each gradient into it as float32 and clears ``param.grad``. On 3.3.1 so does
  ``paddle.amp.decorate(..., master_grad=True)`` when ``FLAGS_enable_tensor_fusion`` is set (the
  hook is registered by ``auto_cast``); without that flag, and on 2.6.2, ``decorate``'s master
  gradient is a float32 ``param.grad`` instead (``core.eager.set_master_grads`` at the end of
  backward), read by ``_grad_ivar()``. On a CPU ``decorate`` returns before any of it. 3.3.1's
  ``Optimizer.step`` and fleet's ``distributed_scaler`` take ``main_grad`` where it is not None,
  else the gradient (:func:`grad_of` follows the same rule); ``MixPrecisionOptimizer`` takes
  ``main_grad`` only; 2.6.2's ``Optimizer.step`` never reads it.
  (3.3.1's ``FLAGS_enable_tensor_fusion`` hook builds an auto-parallel tensor: on a plain
  dygraph parameter Paddle itself fails in it.)
- ``HybridParallelOptimizer.step`` (fleet, both versions) reduces the gradients, then calls
  ``self._step(parameters)``, which the Trainers of PaddleNLP and PaddleFormers also call directly.
- ``Optimizer._parameter_list`` / ``_param_groups``: an optimizer's parameters.
- ``paddle._C_ops.squared_l2_norm`` (the fused kernel ``paddle.nn.ClipGradByGlobalNorm`` uses) and
  ``paddle._C_ops.multiply_`` (in-place multiply without the Python-side argument binding that
  ``Tensor.multiply_`` pays on 2.6); for DistTensors see :mod:`.autoparallel`.
- hapi: ``paddle.Model._scaler`` (the GradScaler ``Model.fit(amp_configs=...)`` builds in dygraph).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterator

import paddle

from . import autoparallel

if TYPE_CHECKING:
    from paddle import Tensor


def optimizer_parameters(optimizer: Any) -> list[Tensor]:
    groups = getattr(optimizer, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        return [p for group in groups for p in group["params"]]
    return list(optimizer._parameter_list or [])


def first_parameter(optimizer: Any) -> Tensor | None:
    """The optimizer's first parameter (attribute reads only), or None: an object without
    Paddle's parameter attributes, or no parameters."""
    groups = getattr(optimizer, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        params = groups[0].get("params") or []
    else:
        params = getattr(optimizer, "_parameter_list", None) or []
    return params[0] if params else None


def grad_of(param: Tensor) -> Tensor | None:
    """The gradient tensor the optimizer applies: ``param.main_grad`` (the float32 master
    gradient) where it is set, else ``param._grad_ivar()``; in-place changes to it reach the
    update. None without a gradient."""
    main = getattr(param, "main_grad", None)
    return main if main is not None else param._grad_ivar()


def iter_grads(params: list[Tensor]) -> Iterator[Tensor]:
    """The :func:`grad_of` of every parameter that has one."""
    for param in params:
        grad = grad_of(param)
        if grad is not None:
            yield grad


_HYBRID_MODULE = "paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer"


def applying_method(optimizer: Any) -> str:
    """The name of the method of ``optimizer`` that applies the update to reduced gradients.

    ``"_step"`` for fleet's ``HybridParallelOptimizer`` (its ``step()`` reduces the gradients
    first, then calls ``_step``, which Trainers also call directly), else ``"step"``. Imports
    nothing: an optimizer can only be fleet's once fleet's module is loaded.
    """
    hybrid = getattr(sys.modules.get(_HYBRID_MODULE), "HybridParallelOptimizer", None)
    return "_step" if hybrid is not None and isinstance(optimizer, hybrid) else "step"


def squared_l2_norm(x: Tensor) -> Tensor:
    """sum(x**2) as a 1-element tensor of ``x``'s dtype, in one fused kernel (Paddle's clip's)."""
    return paddle._C_ops.squared_l2_norm(x)


def multiply_inplace(x: Tensor, factor: Tensor) -> None:
    """``x *= factor`` in place (``factor`` broadcast, same dtype as ``x``); a DistTensor as
    Paddle's clip scales it (:func:`.autoparallel.multiply_`)."""
    if autoparallel.is_dist(x):
        autoparallel.multiply_(x, factor)
    else:
        paddle._C_ops.multiply_(x, factor)


def assign_grad(src: Tensor, dst: Tensor) -> None:
    """Write ``src`` into the gradient tensor ``dst`` the optimizer reads (DistTensors too)."""
    if autoparallel.is_dist(dst):
        autoparallel.assign_(src, dst)
    else:
        paddle.assign(src, output=dst)


def hapi_scaler(model: Any) -> Any:
    """The GradScaler a ``paddle.Model`` built for ``amp_configs`` (None without AMP)."""
    return getattr(model, "_scaler", None)
