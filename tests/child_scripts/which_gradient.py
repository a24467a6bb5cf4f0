"""Which gradient each optimizer's step applies, seen on the weights, beside what the package says.

    python which_gradient.py paddle|fleet|paddleformers|paddlenlp

For every optimizer of the group: a Linear whose parameters get a NaN ``.grad`` beside a finite
``main_grad`` (and the reverse, and a NaN ``.grad`` with ``main_grad=None``), one ``step()``, and
whether the weights turned NaN. Prints one JSON line: ``{name: [seen, said]}`` with ``seen`` and
``said`` each one of ``"grad"``, ``"main_grad, else grad"``, ``"main_grad only"``; ``said`` is
``paddle_amp_ext._compat.optimizer.main_grad_rule``. ``fleet`` starts fleet in this one process.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

if sys.argv[1:] == ["fleet"]:  # before paddle: Paddle 2.6.2's DistributedStrategy and protobuf 7
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dist_scripts"))
    import protobuf_for_fleet  # noqa: F401

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from paddle_amp_ext._compat import optimizer as compat_opt  # noqa: E402

NAN = float("nan")


def _applied_nan(factory, grad: float, main) -> bool:
    """Whether the weights turned NaN after one step with these gradients (``main`` None: unset)."""
    paddle.seed(0)
    layer = paddle.nn.Linear(2, 2)
    layer(paddle.ones([1, 2])).sum().backward()
    for param in layer.parameters():
        param._grad_ivar().set_value(paddle.full(param.shape, grad, param.dtype))
        param.main_grad = None if main is None else paddle.full(param.shape, main, "float32")
    opt = factory(layer.parameters())
    try:
        opt.step(lambda: paddle.to_tensor(1.0)) if type(opt).__name__ == "LBFGS" else opt.step()
    except AssertionError:  # 3.3.1's DygraphShardingOptimizer, after the update: "param.grad should be None"
        pass
    return bool(np.isnan(layer.weight.numpy()).any())


def seen(factory) -> str:
    """What the weights show the step applied."""
    from_grad, from_main = _applied_nan(factory, NAN, 1.0), _applied_nan(factory, 1.0, NAN)
    if from_grad and not from_main:
        return compat_opt.MAIN_GRAD_NEVER
    if from_main and not from_grad:
        return compat_opt.MAIN_GRAD_FIRST if _applied_nan(factory, NAN, None) else compat_opt.MAIN_GRAD_ONLY
    return f"unclear: NaN .grad applied {from_grad}, NaN main_grad applied {from_main}"


def said(factory) -> str:
    layer = paddle.nn.Linear(2, 2)
    return compat_opt.main_grad_rule(factory(layer.parameters()))


def _plain(cls, **kwargs):
    return lambda params: cls(learning_rate=0.1, parameters=params, **kwargs)


def paddle_cases() -> dict:
    cases = {}
    for name, cls in sorted(vars(paddle.optimizer).items()):
        if inspect.isclass(cls) and issubclass(cls, paddle.optimizer.Optimizer) and cls is not paddle.optimizer.Optimizer:
            cases[name] = _plain(cls)
            cases[f"{name}(param groups)"] = (
                lambda c: lambda params: c(learning_rate=0.1, parameters=[{"params": params}]))(cls)
    from paddle.incubate import asp
    from paddle.incubate.optimizer import LookAhead, lbfgs

    cases["incubate LBFGS"] = _plain(lbfgs.LBFGS)
    for inner in (paddle.optimizer.SGD, paddle.optimizer.AdamW):
        cases[f"LookAhead({inner.__name__})"] = (lambda c: lambda params: LookAhead(_plain(c)(params)))(inner)
        cases[f"ASP({inner.__name__})"] = (lambda c: lambda params: asp.asp.OptimizerWithSparsityGuarantee(
            _plain(c)(params)))(inner)  # asp.decorate fails in 3.3.1 dygraph (a PIR Block has no create_parameter)
    return cases


def fleet_cases() -> dict:
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import dygraph_sharding_optimizer as sharding
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
        HybridParallelOptimizer,
    )
    from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionOptimizer

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    wrappers = {
        "HybridParallelOptimizer": lambda opt: HybridParallelOptimizer(opt, hcg, strategy),
        "DygraphShardingOptimizer": lambda opt: sharding.DygraphShardingOptimizer(opt, hcg),
        "MixPrecisionOptimizer": MixPrecisionOptimizer,
        "HybridParallelOptimizer(MixPrecisionOptimizer)":
            lambda opt: HybridParallelOptimizer(MixPrecisionOptimizer(opt), hcg, strategy),
    }
    cases = {}
    for wrapper, wrap in wrappers.items():
        for inner in (paddle.optimizer.SGD, paddle.optimizer.AdamW):
            cases[f"{wrapper}({inner.__name__})"] = (lambda w, c: lambda params: w(_plain(c)(params)))(wrap, inner)
    return cases


def paddleformers_cases() -> dict:
    from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionOptimizer
    from paddleformers.utils.optimizer import AdamWCustom, AdamWMini

    custom = _plain(AdamWCustom, quantization_config=None, tensorwise_offload_optimizer=False)
    return {"AdamWMini": _plain(AdamWMini), "AdamWCustom": custom,
            "MixPrecisionOptimizer(AdamWMini)": lambda params: MixPrecisionOptimizer(_plain(AdamWMini)(params))}


def paddlenlp_cases() -> dict:
    """The optimizer PaddleNLP's Trainer builds (its own ``AdamWDL`` cannot step on Paddle 2.6.2:
    ``_create_optimization_pass() got an unexpected keyword argument 'param_group_idx'``)."""
    import tempfile

    from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionOptimizer
    from paddlenlp.trainer import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(output_dir=out))
    trainers = _plain(cls, **kwargs)
    return {f"Trainer's {cls.__name__}": trainers,
            f"MixPrecisionOptimizer(Trainer's {cls.__name__})": lambda params: MixPrecisionOptimizer(trainers(params))}


if __name__ == "__main__":
    group = {"paddle": paddle_cases, "fleet": fleet_cases, "paddleformers": paddleformers_cases,
             "paddlenlp": paddlenlp_cases}[sys.argv[1]]()
    print(json.dumps({name: [seen(factory), said(factory)] for name, factory in group.items()}))
