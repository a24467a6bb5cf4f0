"""Optimizer parameters, gradient tensors, the fused kernels of Paddle's clip, hapi's scaler.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1):

- ``Tensor._grad_ivar()``: the gradient tensor the optimizer really reads (``Tensor.grad`` is a
  copy-on-access view on both versions, so in-place clipping must go through this).
- ``Optimizer._parameter_list`` / ``_param_groups``: an optimizer's parameters.
- ``paddle._C_ops.squared_l2_norm`` (the fused kernel ``paddle.nn.ClipGradByGlobalNorm`` uses) and
  ``paddle._C_ops.multiply_`` (in-place multiply without the Python-side argument binding that
  ``Tensor.multiply_`` pays on 2.6).
- hapi: ``paddle.Model._scaler`` (the GradScaler ``Model.fit(amp_configs=...)`` builds in dygraph).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import paddle

if TYPE_CHECKING:
    from paddle import Tensor


def optimizer_parameters(optimizer: Any) -> list[Tensor]:
    groups = getattr(optimizer, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        return [p for group in groups for p in group["params"]]
    return list(optimizer._parameter_list or [])


def grad_of(param: Tensor) -> Tensor | None:
    """The gradient tensor the optimizer reads; in-place changes to it reach the update."""
    return param._grad_ivar()


def iter_grads(params: list[Tensor]) -> Iterator[Tensor]:
    for param in params:
        grad = param._grad_ivar()
        if grad is not None:
            yield grad


def squared_l2_norm(x: Tensor) -> Tensor:
    """sum(x**2) as a 1-element tensor of ``x``'s dtype, in one fused kernel (Paddle's clip's)."""
    return paddle._C_ops.squared_l2_norm(x)


def multiply_inplace(x: Tensor, factor: Tensor) -> None:
    """``x *= factor`` in place (``factor`` broadcast, same dtype as ``x``)."""
    paddle._C_ops.multiply_(x, factor)


def hapi_scaler(model: Any) -> Any:
    """The GradScaler a ``paddle.Model`` built for ``amp_configs`` (None without AMP)."""
    return getattr(model, "_scaler", None)
