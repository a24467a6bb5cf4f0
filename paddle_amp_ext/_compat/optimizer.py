"""Optimizer parameters, gradient tensors, the fused kernels of Paddle's clip, hapi's scaler.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1):

- ``Tensor._grad_ivar()``: the gradient tensor the optimizer really reads (``Tensor.grad`` is a
  copy-on-access view on both versions, so in-place clipping must go through this).
- ``param.main_grad``: the float32 master gradient (which optimizer reads it:
  :func:`main_grad_rule`). Fleet's ``MixPrecisionLayer``
  (``paddle.distributed.fleet.utils.mix_precision_utils``, PaddleNLP's and PaddleFormers'
  ``amp_master_grad=True``) sets it to None on every parameter it wraps and, from a gradient hook,
  accumulates each gradient into it as float32 and clears ``param.grad``. On 3.3.1 so does
  ``paddle.amp.decorate(..., master_grad=True)`` when ``FLAGS_enable_tensor_fusion`` is set (the
  hook is registered by ``auto_cast``); without that flag, and on 2.6.2, ``decorate``'s master
  gradient is a float32 ``param.grad`` instead (``core.eager.set_master_grads`` at the end of
  backward), read by ``_grad_ivar()``. On a CPU ``decorate`` returns before any of it. Which
  ``step`` reads it is a table by the class that defines ``step`` (:data:`_STEP_READS`): 3.3.1's
  ``Optimizer.step`` (SGD, Momentum, Adagrad, Adadelta, Adamax, RMSProp, Lamb, NAdam, RAdam,
  ASGD, Rprop) takes ``main_grad`` where it is not None, else the gradient (:func:`grad_of`),
  but only for a flat parameter list (with param groups it reads ``_grad_ivar()``) and
  ``main_grad`` only under ``enable_tensor_fusion``; 2.6.2's never reads it. ``Adam.step`` and
  ``AdamW.step`` (their own, both versions) and ``LBFGS.step`` read ``_grad_ivar()``/``grad``
  only; ``MixPrecisionOptimizer`` takes ``main_grad`` only; ``DygraphShardingOptimizer`` (V2
  too) ``main_grad`` where set, both versions, whatever it wraps; ``HybridParallelOptimizer``,
  ``HeterParallelOptimizer``, ``GroupShardedOptimizerStage2``, incubate's ``LookAhead`` and
  ASP's ``OptimizerWithSparsityGuarantee`` call their inner optimizer's ``step``. Fleet's
  ``distributed_scaler`` takes ``main_grad`` where set. In dygraph ``Optimizer.minimize`` runs no
  backward and no ``step``: it applies ``core.eager.get_all_grads`` (the ``_grad_ivar()`` of every parameter
  that is not ``stop_gradient``, never ``main_grad``; both versions). Every ``step`` skips a
  ``stop_gradient=True`` parameter (``trainable=False`` sets it), whose gradient
  ``clear_grad()`` leaves in place; Paddle's ``GradScaler._unscale``
  (``core.eager.get_grads_lists``) still takes it.
  (3.3.1's ``FLAGS_enable_tensor_fusion`` hook builds an auto-parallel tensor: on a plain
  dygraph parameter Paddle itself fails in it.)
- ``HybridParallelOptimizer.step`` (fleet, both versions) reduces the gradients, then calls
  ``self._step(parameters)``, which the Trainers of PaddleNLP and PaddleFormers also call directly.
- ``Optimizer._parameter_list`` / ``_param_groups``: an optimizer's parameters.
- ``paddle._C_ops.squared_l2_norm`` (the fused kernel ``paddle.nn.ClipGradByGlobalNorm`` uses) and
  ``paddle._C_ops.multiply_`` (in-place multiply without the Python-side argument binding that
  ``Tensor.multiply_`` pays on 2.6); for DistTensors see :mod:`.autoparallel`.
- ``Optimizer._learning_rate``: the ``LRScheduler`` object an optimizer was built with (or a
  float); fleet's wrappers keep the optimizer in ``_inner_opt`` (both versions).
- hapi: ``paddle.Model._scaler`` (the GradScaler ``Model.fit(amp_configs=...)`` builds in dygraph).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import paddle

from . import autoparallel
from .tracer import PADDLE_VERSION

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
    """``param.main_grad`` (the float32 master gradient) where it is set, else
    ``param._grad_ivar()`` (None without a gradient): one parameter's gradient by 3.3.1's
    ``Optimizer.step`` rule, for tests and scripts that poke a gradient. Which gradient a step
    applies, for which parameters, is :mod:`paddle_amp_ext.gradients`' to say."""
    main = getattr(param, "main_grad", None)
    return main if main is not None else param._grad_ivar()


#: How an optimizer picks a parameter's gradient (:func:`main_grad_rule`).
MAIN_GRAD_FIRST, MAIN_GRAD_ONLY, MAIN_GRAD_NEVER = "main_grad, else grad", "main_grad only", "grad only"
_BASE_STEP, _DELEGATES = "Optimizer.step", "delegates"
_FLEET = "paddle.distributed.fleet."
_DYGRAPH_OPT = _FLEET + "meta_optimizers.dygraph_optimizer."
_SHARDING = _DYGRAPH_OPT + "dygraph_sharding_optimizer"
_MIX_PRECISION_MODULE = _FLEET + "utils.mix_precision_utils"
_HYBRID_MODULE = _DYGRAPH_OPT + "hybrid_parallel_optimizer"

#: What the ``step`` each class defines reads (from reading Paddle's code, and checked on the CPU
#: by tests/hostile/test_hostile_gradients.py with a NaN ``.grad`` beside a finite ``main_grad``
#: and the reverse, on 2.6.2 and 3.3.1). Keyed by the class that defines ``step``: a subclass
#: that does not override it reads what its base reads. A wrapper that delegates names the
#: attribute holding the optimizer whose ``step`` it calls.
_STEP_READS: dict = {
    ("paddle.optimizer.optimizer", "Optimizer"): _BASE_STEP,        # see main_grad_rule
    ("paddle.optimizer.adam", "Adam"): MAIN_GRAD_NEVER,             # _grad_ivar() only, both versions
    ("paddle.optimizer.adamw", "AdamW"): MAIN_GRAD_NEVER,           # _grad_ivar() only, both versions
    ("paddle.optimizer.lbfgs", "LBFGS"): MAIN_GRAD_NEVER,           # p.grad, after calling the closure
    (_MIX_PRECISION_MODULE, "MixPrecisionOptimizer"): MAIN_GRAD_ONLY,
    (_SHARDING, "DygraphShardingOptimizer"): MAIN_GRAD_FIRST,       # both versions, whatever it wraps
    (_SHARDING, "DygraphShardingOptimizerV2"): MAIN_GRAD_FIRST,
    (_HYBRID_MODULE, "HybridParallelOptimizer"): (_DELEGATES, "_inner_opt"),    # _step: _inner_opt.step()
    (_DYGRAPH_OPT + "heter_parallel_optimizer", "HeterParallelOptimizer"): (_DELEGATES, "_inner_opt"),
    (_FLEET + "meta_parallel.sharding.group_sharded_optimizer_stage2", "GroupShardedOptimizerStage2"):
        (_DELEGATES, "_optim"),
    ("paddle.incubate.optimizer.lookahead", "LookAhead"): (_DELEGATES, "inner_optimizer"),  # then slow weights
    ("paddle.incubate.asp.asp", "OptimizerWithSparsityGuarantee"): (_DELEGATES, "_optimizer"),  # then masks
    ("paddle.incubate.optimizer.lbfgs", "LBFGS"): MAIN_GRAD_NEVER,
    ("paddle.incubate.optimizer.modelaverage", "ModelAverage"): MAIN_GRAD_NEVER,  # averages, applies none
}


def step_reads(cls: type) -> Any:
    """What ``cls.step`` reads, from :data:`_STEP_READS` by the nearest class of ``cls``'s MRO that
    defines ``step`` and is listed (a class of a script that overrides ``step`` is assumed to call
    its base's); None when no listed class is found."""
    for klass in getattr(cls, "__mro__", ()):
        if "step" in vars(klass):
            found = _STEP_READS.get((klass.__module__, klass.__qualname__))
            if found is not None:
                return found
    return None


def main_grad_rule(optimizer: Any, via: str = "step") -> str:
    """Which gradient ``optimizer.step()`` (``via="step"``) or ``optimizer.minimize()``
    (``via="minimize"``) applies: one of :data:`MAIN_GRAD_FIRST`, :data:`MAIN_GRAD_ONLY`,
    :data:`MAIN_GRAD_NEVER`.

    By the class whose ``step`` runs (:func:`step_reads`); a wrapper that delegates is followed
    to the optimizer it calls. ``Optimizer.step`` itself: on 3.x ``main_grad`` where set for a
    flat parameter list, ``main_grad`` only under ``enable_tensor_fusion``, ``grad`` only with
    param groups; on 2.6 ``grad`` only. An object no listed class covers (a duck-typed
    optimizer) is followed through ``_inner_opt``/``_optim``, else gets :data:`MAIN_GRAD_FIRST`
    (fleet's ``distributed_scaler``'s rule).
    """
    if via == "minimize":
        return MAIN_GRAD_NEVER
    opt, seen = optimizer, set()
    while opt is not None and id(opt) not in seen:
        seen.add(id(opt))
        reads = step_reads(type(opt))
        state = vars(opt) if hasattr(opt, "__dict__") else {}
        if reads == _BASE_STEP:
            if PADDLE_VERSION < (3, 0, 0):
                return MAIN_GRAD_NEVER
            groups = getattr(opt, "_param_groups", None)
            if groups and isinstance(groups[0], dict):
                return MAIN_GRAD_NEVER
            return MAIN_GRAD_ONLY if getattr(opt, "enable_tensor_fusion", False) else MAIN_GRAD_FIRST
        if isinstance(reads, str):
            return reads
        opt = state.get(reads[1]) if reads is not None else (state.get("_inner_opt") or state.get("_optim"))
    return MAIN_GRAD_FIRST


def main_grad_value(param: Tensor) -> Any:
    """``param.main_grad`` as set (None where absent)."""
    return getattr(param, "main_grad", None)


def grad_ivar(param: Tensor) -> Tensor | None:
    """The gradient tensor Paddle's optimizer reads (``_grad_ivar()``; in-place changes reach it)."""
    return param._grad_ivar()



def applying_method(optimizer: Any) -> str:
    """The name of the method of ``optimizer`` that applies the update to reduced gradients.

    ``"_step"`` for fleet's ``HybridParallelOptimizer`` (its ``step()`` reduces the gradients
    first, then calls ``_step``, which Trainers also call directly), else ``"step"``. Imports
    nothing: an optimizer can only be fleet's once fleet's module is loaded.
    """
    hybrid = getattr(sys.modules.get(_HYBRID_MODULE), "HybridParallelOptimizer", None)
    return "_step" if hybrid is not None and isinstance(optimizer, hybrid) else "step"


_WRAPPERS = ((_HYBRID_MODULE, "HybridParallelOptimizer"), (_MIX_PRECISION_MODULE, "MixPrecisionOptimizer"))


def optimizer_wrapper_classes() -> list:
    """fleet's optimizer wrappers that are not ``paddle.optimizer.Optimizer`` subclasses and whose
    ``step`` does not (``MixPrecisionOptimizer``) or not only (``HybridParallelOptimizer``) call
    their inner optimizer's: those of their modules already loaded (``import paddle`` loads both
    on 2.6.2 and 3.3.1). Imports nothing."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in _WRAPPERS)
    return [cls for cls in found if isinstance(cls, type)]


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


def bound_scheduler(optimizer: Any) -> Any:
    """The ``paddle.optimizer.lr.LRScheduler`` an optimizer reads its learning rate from, or None.

    Paddle keeps the scheduler object itself in ``optimizer._learning_rate`` (a float there is a
    constant rate); fleet's wrappers (``HybridParallelOptimizer``, ``MixPrecisionOptimizer``)
    hold the optimizer in ``_inner_opt``. Reads attributes only (no ``__getattr__`` of a
    wrapper is relied on).
    """
    seen = 0
    while optimizer is not None and seen < 8:  # a bounded walk: wrappers of wrappers
        rate = vars(optimizer).get("_learning_rate") if hasattr(optimizer, "__dict__") else None
        if isinstance(rate, paddle.optimizer.lr.LRScheduler):
            return rate
        optimizer = vars(optimizer).get("_inner_opt") if hasattr(optimizer, "__dict__") else None
        seen += 1
    return None
