"""The models ``check --verify`` runs: a small CNN, a small Transformer block, and ``--model``.

``--model module:factory`` names a function that takes no argument and returns ``(layer, inputs)``:
a ``paddle.nn.Layer`` and the input batch (a Tensor, or a tuple/list of Tensors) its forward takes.
The loss of a training step is the mean of the forward's first floating-point output.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import paddle

from .verdict import ModelFacts, odd_dimensions

_SPEC = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)$")
_MATMUL_LAYERS = ("Linear", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose")


class ModelError(ValueError):
    """``--model`` cannot be used: the message names the spec, what went wrong and the fix."""


@dataclass(frozen=True)
class ModelCase:
    """A model and an input batch for it, built on the current device.

    Attributes:
        name: ``"cnn"``, ``"transformer"`` or the ``--model`` spec.
        build: makes ``(layer, inputs)`` on the current device; same weights and inputs every call.
    """

    name: str
    build: Callable[[], Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]]


def _seeded(make: Callable[[], Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]]):
    def build() -> Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]:
        paddle.seed(2024)
        return make()
    return build


def _cnn() -> Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]:
    nn = paddle.nn
    model = nn.Sequential(
        nn.Conv2D(3, 32, 3, padding=1), nn.BatchNorm2D(32), nn.ReLU(),
        nn.Conv2D(32, 64, 3, stride=2, padding=1), nn.BatchNorm2D(64), nn.ReLU(),
        nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(64, 16),
    )
    return model, (paddle.randn([32, 3, 32, 32]),)


def _transformer() -> Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]:
    layer = paddle.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, dropout=0.0)
    return layer, (paddle.randn([16, 64, 128]),)


def _overflowing_linear() -> Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]:
    """Row i of the output is 12800 * i exactly: rows 6 and up overflow float16 (> 65504)."""
    layer = paddle.nn.Linear(256, 64)
    layer.weight.set_value(paddle.full([256, 64], 0.5))
    layer.bias.set_value(paddle.zeros([64]))
    return layer, (paddle.arange(16, dtype="float32").reshape([16, 1]) * paddle.full([1, 256], 100.0),)


#: The Linear whose float16 output overflows in known rows, for the rehearsal comparison.
OVERFLOWING_LINEAR = ModelCase("overflowing Linear", _seeded(_overflowing_linear))
#: The standard small models, by name.
STANDARD = (ModelCase("cnn", _seeded(_cnn)), ModelCase("transformer", _seeded(_transformer)))


def _as_inputs(spec: str, value: Any) -> Tuple[paddle.Tensor, ...]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not items or not all(isinstance(t, paddle.Tensor) for t in items):
        kinds = [type(t).__name__ for t in items]
        raise ModelError(f"--model {spec}: the inputs must be a paddle.Tensor or a tuple/list of them, "
                         f"received {kinds or 'an empty sequence'}")
    return items


def load(spec: str) -> ModelCase:
    """The ``--model module:factory`` case; the factory is called at each build.

    Raises:
        ModelError: the spec is malformed, the module cannot be imported, or it has no such callable.
    """
    match = _SPEC.match(str(spec).strip())
    if not match:
        raise ModelError(f"--model expects MODULE:FACTORY (e.g. 'mypkg.models:small_net'), received {spec!r}")
    module_name, attr = match["module"], match["attr"]
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error in it is theirs to see
        raise ModelError(f"--model {spec}: cannot import {module_name!r}: {type(exc).__name__}: {exc}. "
                         "Run from the directory that holds it, or put it on PYTHONPATH") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ModelError(f"--model {spec}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"--model {spec}: {attr!r} is a {type(target).__name__}, not a callable factory")
    factory = target

    def build() -> Tuple[paddle.nn.Layer, Tuple[paddle.Tensor, ...]]:
        paddle.seed(2024)
        try:
            made = factory()
        except Exception as exc:
            raise ModelError(f"--model {spec}: the factory raised {type(exc).__name__}: {exc}") from None
        if not (isinstance(made, tuple) and len(made) == 2):
            raise ModelError(f"--model {spec}: the factory must return (layer, inputs), received "
                             f"{type(made).__name__}")
        layer, inputs = made
        if not isinstance(layer, paddle.nn.Layer):
            raise ModelError(f"--model {spec}: the factory's first value must be a paddle.nn.Layer, received "
                             f"{type(layer).__name__}")
        return layer, _as_inputs(spec, inputs)

    return ModelCase(str(spec), build)


def first_float(output: Any) -> paddle.Tensor:
    """The first floating-point tensor of a forward's output (a Tensor, or nested tuples/lists/dicts).

    Raises:
        ModelError: there is none.
    """
    stack: List[Any] = [output]
    while stack:
        item = stack.pop(0)
        if isinstance(item, paddle.Tensor) and item.is_floating_point():
            return item
        if isinstance(item, dict):
            stack = list(item.values()) + stack
        elif isinstance(item, (tuple, list)):
            stack = list(item) + stack
    raise ModelError(f"the forward returned no floating-point tensor (received {type(output).__name__})")


def try_forward(case: ModelCase) -> ModelFacts:
    """Build ``case`` and run one float32 forward without gradients; its facts for the verdict.

    Raises:
        ModelError: the build or the forward fails (wrong input shapes, ...), or no float output.
    """
    layer, inputs = case.build()
    try:
        with paddle.no_grad():
            output = layer(*inputs)
    except Exception as exc:
        shapes = [list(t.shape) for t in inputs]
        raise ModelError(f"{case.name}: the forward on inputs of shapes {shapes} raised "
                         f"{type(exc).__name__}: {exc}") from None
    first_float(output)
    return facts(layer, inputs)


def facts(layer: paddle.nn.Layer, inputs: Tuple[paddle.Tensor, ...]) -> ModelFacts:
    """The batch size and the matmul/conv weights whose dimensions are not multiples of 8."""
    weights: Dict[str, List[int]] = {}
    for name, sub in layer.named_sublayers(include_self=True):
        weight = getattr(sub, "weight", None)
        if type(sub).__name__ in _MATMUL_LAYERS and isinstance(weight, paddle.Tensor):
            weights[f"{name or type(sub).__name__}.weight"] = list(weight.shape)
    batch = int(inputs[0].shape[0]) if inputs[0].ndim else 1
    return ModelFacts(batch=batch, odd_dims=odd_dimensions(weights))
