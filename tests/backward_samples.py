"""One call of every op the rehearsal rounds, on inputs above its in-place threshold (6144 elements).

``SAMPLES[name](inputs)`` calls the rehearsal's entry point ``name`` (``ops.FUNCTIONS`` and
``ops.METHODS``; a dunder name is the Tensor method, a method named as a function calls the same
op) on ``inputs``, made by :func:`make_inputs`.
Used by tests/test_backward_table.py, tests/test_inplace_rounding.py and
tests/dist_scripts/inplace_rounding.py (there with DistTensors).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812

ROWS, COLS = 64, 96  # 6144 elements: above rounding.SMALL (4096)


def make_inputs(seed: int = 0, place: Callable[[str, paddle.Tensor], paddle.Tensor] = lambda name, t: t,
                rows: int = ROWS) -> Dict[str, Any]:
    """Float32 inputs (``x``, ``y``: [rows, 96]; ``positive``: values in [0.5, 2); ``weight``: [96, 96];
    ``label``: [rows, 1]), each made by ``place(name, tensor)`` (a DistTensor in the launched
    script), gradients required."""
    rng = np.random.default_rng(seed)
    values = {
        "x": rng.standard_normal((rows, COLS)),
        "y": rng.standard_normal((rows, COLS)),
        "positive": rng.uniform(0.5, 2.0, (rows, COLS)),
        "weight": rng.standard_normal((COLS, COLS)) / np.sqrt(COLS),
        "gamma": rng.uniform(0.5, 1.5, (COLS,)),
        "beta": rng.standard_normal((COLS,)) * 0.1,
    }
    inputs: Dict[str, Any] = {}
    for name, value in values.items():
        tensor = place(name, paddle.to_tensor(value.astype(np.float32)))
        tensor.stop_gradient = False
        inputs[name] = tensor
    inputs["label"] = place("label", paddle.to_tensor(rng.integers(0, COLS, (rows, 1)).astype(np.int64)))
    inputs["running_mean"] = place("running_mean", paddle.zeros([COLS]))  # batch_norm's, no gradient
    inputs["running_var"] = place("running_var", paddle.ones([COLS]))
    return inputs


def _batch_norm(i: Dict[str, Any]) -> Any:
    return F.batch_norm(i["x"], i["running_mean"], i["running_var"], i["gamma"], i["beta"], training=True)


#: entry point name -> a call of it (ARITH and COMPUTE entry points of the rehearsal)
SAMPLES: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "layer_norm": lambda i: F.layer_norm(i["x"], [COLS], i["gamma"], i["beta"]),
    "batch_norm": _batch_norm,
    "add": lambda i: paddle.add(i["x"], i["y"]),
    "subtract": lambda i: paddle.subtract(i["x"], i["y"]),
    "multiply": lambda i: paddle.multiply(i["x"], i["y"]),
    "divide": lambda i: paddle.divide(i["x"], i["positive"]),
    "scale": lambda i: paddle.scale(i["x"], 2.0, 0.5),
    "tanh": lambda i: paddle.tanh(i["x"]),
    "gelu": lambda i: F.gelu(i["x"]),
    "silu": lambda i: F.silu(i["x"]),
    "sigmoid": lambda i: F.sigmoid(i["x"]),
    "dropout": lambda i: F.dropout(i["x"], 0.25),
    "sqrt": lambda i: paddle.sqrt(i["positive"]),
    "softmax": lambda i: F.softmax(i["x"]),
    "log_softmax": lambda i: F.log_softmax(i["x"]),
    "cross_entropy": lambda i: F.cross_entropy(i["x"], i["label"], reduction="none"),
    "softmax_with_cross_entropy": lambda i: F.softmax_with_cross_entropy(i["x"], i["label"], return_softmax=True),
    "__add__": lambda i: i["x"] + i["y"],
    "__radd__": lambda i: i["y"].__radd__(i["x"]),
    "__sub__": lambda i: i["x"] - i["y"],
    "__rsub__": lambda i: i["y"].__rsub__(i["x"]),
    "__mul__": lambda i: i["x"] * i["y"],
    "__rmul__": lambda i: i["y"].__rmul__(i["x"]),
    "__truediv__": lambda i: i["x"] / i["positive"],
    "__rtruediv__": lambda i: i["positive"].__rtruediv__(i["x"]),
    "matmul": lambda i: paddle.matmul(i["x"], i["weight"]),
    "mm": lambda i: paddle.mm(i["x"], i["weight"]),
    "__matmul__": lambda i: i["x"] @ i["weight"],
    "__rmatmul__": lambda i: i["weight"].__rmatmul__(i["x"]),
    "bmm": lambda i: paddle.bmm(i["x"].reshape([2, -1, COLS]), i["weight"].reshape([1, COLS, COLS]).tile([2, 1, 1])),
    "einsum": lambda i: paddle.einsum("ij,jk->ik", i["x"], i["weight"]),
    "linear": lambda i: F.linear(i["x"], i["weight"]),
    "conv1d": lambda i: F.conv1d(i["x"].reshape([-1, 16, COLS]), i["weight"].reshape([16, 16, 36])[:, :, :3]),
    "conv2d": lambda i: F.conv2d(i["x"].reshape([-1, 16, 8, 12]), i["weight"].reshape([16, 16, 6, 6])[:, :, :3, :3],
                                 padding=1),
}

def outputs(result: Any) -> list:
    """The tensors an entry point returned (one, or several)."""
    return list(result) if isinstance(result, (list, tuple)) else [result]
