"""Op-level rehearsal: Paddle's ops rounded as AMP would run them, wherever they are called.

While any ``fp16_emulation``/``rehearse`` is active in the process, the Python entry points in
:data:`OPS` are wrapped. In a thread that rehearses, a wrapped op decides as Paddle's eager AMP
does, by the effective lists (those of the innermost ``auto_cast`` entered inside the
rehearsal, else the rehearsal's own):

- black-listed: runs in float32; nothing is rounded;
- white-listed (at O2 with ``use_promote=False``, every op not black-listed): its float32
  inputs are rounded, and its output is rounded (ops that only move values, like ``reshape``,
  need no output rounding); under ``fp16_emulation(model)`` only inside ``model``'s forward;
- neither ("follow the inputs", also at O2 with Paddle's default ``use_promote=True``): runs
  in low precision when every float input is a low-precision value (:mod:`.lowprec`), with its
  output rounded, else in float32.

A function Paddle runs as several ops under different rules (a convolution and its bias add;
``F.linear`` on 2.6.2) is run op by op (:mod:`.composite`). A white-listed ``F.linear`` runs as
one autograd node with the same results (:mod:`.fused`).

Wherever this thread rehearses (float32 regions included), ops whose CPU kernel treats inf and
NaN unlike Paddle's CUDA kernel (softmax, log_softmax, cross entropy, relu's gradient, sqrt)
return what the CUDA kernel returns (:mod:`.nonfinite`).

Rounded outputs are marked as low precision, so they are not rounded twice and the ops after
them follow. A fresh output is rounded in its own buffer, unless the grad node that made it reads
it in its backward (:func:`paddle_amp_ext._compat.backward.saved_by_backward`; docs/rehearsal.md).
Backward is rounded where forward was (:func:`.rounding.round_trip`). An
``auto_cast(enable=False)`` inside the rehearsal, or a ``keep_fp32`` layer, turns rounding off;
code being converted by ``paddle.jit.to_static`` is not rounded.

Entry points are public Python attributes, looked up at call time by Paddle's own code
(``nn.MultiHeadAttention`` calls ``paddle.matmul`` and ``paddle.tensor.matmul``, ``nn.Linear``
calls ``F.linear``), wrapped in every Paddle namespace that exposes them, checked on Paddle
2.6.2 and 3.3.1. Ops reached only from C++ are not wrapped; an op called from inside a wrapped
op is part of it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Tuple

import paddle

from .. import _compat, _state
from .._compat import kernels
from .._compat.layers import PRIVATE_ENTRY_POINTS
from . import composite, fused, lowprec, nonfinite, pool

#: Kinds of op: ``compute`` ops do the arithmetic AMP is for (the doctor watches them);
#: ``arith`` ops make new values; ``move`` ops only move or select values.
COMPUTE, ARITH, MOVE = "compute", "arith", "move"

#: (function name, op types AMP looks it up as, kind), wrapped in each of :data:`NAMESPACES`
#: that has it.
FUNCTIONS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("matmul", ("matmul_v2",), COMPUTE),
    ("mm", ("matmul_v2",), COMPUTE),
    ("bmm", ("bmm",), COMPUTE),
    ("einsum", ("einsum",), COMPUTE),
    ("linear", ("matmul_v2", "linear_v2"), COMPUTE),
    ("conv1d", ("conv2d",), COMPUTE),
    ("conv2d", ("conv2d",), COMPUTE),
    ("conv3d", ("conv3d",), COMPUTE),
    ("conv1d_transpose", ("conv2d_transpose",), COMPUTE),
    ("conv2d_transpose", ("conv2d_transpose",), COMPUTE),
    ("conv3d_transpose", ("conv3d_transpose",), COMPUTE),
    ("_conv_nd", ("conv2d",), COMPUTE),  # nn.Conv2D/Conv3D; the op type is its op_type argument
    ("embedding", ("lookup_table_v2",), MOVE),
    ("layer_norm", ("layer_norm",), ARITH),  # nn.LayerNorm calls paddle.nn.layer.norm.layer_norm
    ("batch_norm", ("batch_norm",), ARITH),  # nn.BatchNorm1D/2D/3D
    ("add", ("elementwise_add",), ARITH),
    ("subtract", ("elementwise_sub",), ARITH),
    ("multiply", ("elementwise_mul",), ARITH),
    ("divide", ("elementwise_div",), ARITH),
    ("scale", ("scale",), ARITH),
    ("tanh", ("tanh",), ARITH),
    ("gelu", ("gelu",), ARITH),
    ("silu", ("silu",), ARITH),
    ("sigmoid", ("sigmoid",), ARITH),
    ("dropout", ("dropout",), ARITH),
    ("sqrt", ("sqrt",), ARITH),
    ("softmax", ("softmax",), ARITH),
    ("log_softmax", ("log_softmax",), ARITH),
    ("cross_entropy", ("softmax_with_cross_entropy", "cross_entropy"), ARITH),
    ("softmax_with_cross_entropy", ("softmax_with_cross_entropy",), ARITH),
    ("relu", ("relu",), MOVE),
    ("reshape", ("reshape2",), MOVE),
    ("transpose", ("transpose2",), MOVE),
    ("flatten", ("flatten_contiguous_range",), MOVE),
    ("squeeze", ("squeeze2",), MOVE),
    ("unsqueeze", ("unsqueeze2",), MOVE),
    ("concat", ("concat",), MOVE),
    ("split", ("split",), MOVE),
    ("chunk", ("split",), MOVE),
)

#: (Tensor method, op types, kind).
METHODS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("matmul", ("matmul_v2",), COMPUTE),
    ("__matmul__", ("matmul_v2",), COMPUTE),
    ("__rmatmul__", ("matmul_v2",), COMPUTE),
    ("mm", ("matmul_v2",), COMPUTE),
    ("__add__", ("elementwise_add",), ARITH),
    ("__radd__", ("elementwise_add",), ARITH),
    ("__sub__", ("elementwise_sub",), ARITH),
    ("__rsub__", ("elementwise_sub",), ARITH),
    ("__mul__", ("elementwise_mul",), ARITH),
    ("__rmul__", ("elementwise_mul",), ARITH),
    ("__truediv__", ("elementwise_div",), ARITH),
    ("__rtruediv__", ("elementwise_div",), ARITH),
    ("add", ("elementwise_add",), ARITH),
    ("multiply", ("elementwise_mul",), ARITH),
    ("tanh", ("tanh",), ARITH),
    ("sqrt", ("sqrt",), ARITH),
    ("__neg__", ("scale",), MOVE),
    ("__getitem__", ("slice",), MOVE),
    ("reshape", ("reshape2",), MOVE),
    ("transpose", ("transpose2",), MOVE),
    ("flatten", ("flatten_contiguous_range",), MOVE),
    ("squeeze", ("squeeze2",), MOVE),
    ("unsqueeze", ("unsqueeze2",), MOVE),
    ("split", ("split",), MOVE),
    ("chunk", ("split",), MOVE),
)

#: Ops Paddle's AMP decides by the input X alone, casting none of the others (scale, bias,
#: running statistics): ``GetPromoteType`` and ``AmpAutoCast`` for batch_norm and layer_norm.
X_ONLY = frozenset({"batch_norm", "layer_norm"})

#: Paddle namespaces whose functions Paddle's own layers call (``paddle.tensor.matmul`` is a
#: different object from ``paddle.matmul`` on 3.3.1).
NAMESPACES: Tuple[str, ...] = (
    "paddle", "paddle.tensor", "paddle.tensor.linalg", "paddle.tensor.math", "paddle.tensor.manipulation",
    "paddle.tensor.einsum", "paddle.nn.functional", "paddle.nn.functional.common",
    "paddle.nn.functional.activation", "paddle.nn.functional.conv", "paddle.nn.functional.norm",
    "paddle.nn.layer.norm",
)

_lock = threading.Lock()
_users = 0
_saved: List[Tuple[Any, str, Any]] = []
_observers: List[Callable[[str, Any], None]] = []
_inside = threading.local()  # .depth: wrapped ops running in this thread


@functools.cache  # one wrapper per original: entering a rehearsal re-installs it (124 entry points)
def _wrap(original: Callable, name: str, op_types: Tuple[str, ...], kind: str) -> Callable:
    kernel = nonfinite.on_gpu_terms(name, original)  # what the GPU returns for inf and NaN

    @functools.wraps(original)
    def op(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return original(*args, **kwargs)
        _inside.depth = 1
        try:
            lists = _state.rehearsed_lists()
            if lists is not None and _compat.runs_eagerly():
                out = _rehearsed(kernel, name, op_types, kind, lists, args, kwargs)
            elif _state.emulated_dtype() is not None and _compat.runs_eagerly():
                out = kernel(*args, **kwargs)  # a float32 region of the rehearsal still runs on a GPU
            else:
                out = original(*args, **kwargs)
        finally:
            _inside.depth = 0
        if kind == COMPUTE:
            for observe in _observers:
                observe(op_types[0], out)
        return out

    op.__paddle_amp_ext_original__ = original  # type: ignore[attr-defined]
    return op


def _rehearsed(original: Callable, name: str, op_types: Tuple[str, ...], kind: str, lists: _state.Lists,
               args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    parts = composite.split(name, original, args, kwargs)
    if parts is None:
        return _one_op(original, name, op_types, kind, lists, args, kwargs)
    if name == "linear" and parts.bias is not None and _linear_with_float32_bias(parts, lists):
        out = fused.linear(original, args, kwargs, _state.emulated_dtype(), bias_rounded=False)
        if out is not None:  # one autograd node, the same bits
            return out
    out = _one_op(original, name, parts.op_types, kind, lists, parts.args, parts.kwargs)
    if parts.bias is None:
        return out
    bias = composite.along(parts.bias, len(out.shape), parts.axis)
    dtype = _state.emulated_dtype()
    if lowprec.is_low(parts.bias, dtype):
        lowprec.mark(bias, dtype)
    return _one_op(paddle.add, "add", ("elementwise_add",), ARITH, lists, (out, bias), {})


def _linear_with_float32_bias(parts: composite.Split, lists: _state.Lists) -> bool:
    """Whether a split ``F.linear`` (Paddle 2.6) runs its product in low precision here and adds
    its bias in float32: the product is white-listed and rounded here, and the ``add`` is
    black-listed, or neither white-listed nor given a low-precision bias."""
    if not lists.black.isdisjoint(parts.op_types) or not (runs_low(parts.op_types, lists) and _state.in_scope()):
        return False
    if "elementwise_add" in lists.black:
        return True
    return not (runs_low(("elementwise_add",), lists) or lowprec.is_low(parts.bias, _state.emulated_dtype()))


def runs_low(op_types: Tuple[str, ...], lists: _state.Lists) -> bool:
    """Whether AMP casts an op's float32 inputs to low precision whatever they hold: it is
    white-listed, or every op not black-listed is at O2 with ``use_promote=False``."""
    return not lists.white.isdisjoint(op_types) or (lists.level == "O2" and not lists.promote)


def _one_op(original: Callable, name: str, op_types: Tuple[str, ...], kind: str, lists: _state.Lists,
            args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    if not lists.black.isdisjoint(op_types):
        return original(*args, **kwargs)
    dtype = _state.emulated_dtype()
    x_only = name in X_ONLY  # the inputs AMP looks at and casts: X alone, or all
    cast, rest = (args[:1], args[1:]) if x_only else (args, ())
    if runs_low(op_types, lists) and _state.in_scope():
        if name == "linear":  # one autograd node, the same bits (:mod:`.fused`)
            out = fused.linear(original, args, kwargs, dtype)
            if out is not None:
                return lowprec.mark(out, dtype)
        cast = lowprec.rounded(cast, dtype)
        if not x_only:
            kwargs = {k: lowprec.rounded(v, dtype) for k, v in kwargs.items()}
    elif not lowprec.all_low((*cast, *(() if x_only else kwargs.values())), dtype):  # "follow the inputs"
        return original(*args, **kwargs)
    args = (*cast, *rest)
    out = original(*args, **kwargs)
    if kind == MOVE:
        return lowprec.mark(out, dtype)
    fresh = not any(out is value for value in (*args, *kwargs.values()))
    return lowprec.rounded(out, dtype, in_place=fresh)  # in place unless its backward reads it


@functools.lru_cache(maxsize=1)
def _entry_points() -> List[Tuple[Any, str, Tuple[str, ...], str]]:
    """(owner, attribute, op types, kind) of every entry point this Paddle has (looked up once)."""
    import importlib

    found: List[Tuple[Any, str, Tuple[str, ...], str]] = []
    for module_name in NAMESPACES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a namespace this Paddle version does not have
            continue
        private = {name for owner, name in PRIVATE_ENTRY_POINTS if owner == module_name}
        for name, op_types, kind in FUNCTIONS:
            if callable(getattr(module, name, None)) and (not name.startswith("_") or name in private):
                found.append((module, name, op_types, kind))
    for name, op_types, kind in METHODS:
        if callable(getattr(paddle.Tensor, name, None)):
            found.append((paddle.Tensor, name, op_types, kind))
    return found


def acquire() -> None:
    """Wrap the entry points (the first rehearsal in the process does; later ones count)."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        _compat.watch_for_sot()
        kernels.SCRATCH.enable()
        for owner, name, op_types, kind in _entry_points():
            original = getattr(owner, name)
            _saved.append((owner, name, original))
            setattr(owner, name, _wrap(original, name, op_types, kind))


def release() -> None:
    """Undo :func:`acquire` (the last rehearsal to end restores Paddle's functions)."""
    global _users
    with _lock:
        _users -= 1
        if _users > 0:
            return
        while _saved:
            owner, name, original = _saved.pop()
            setattr(owner, name, original)
        kernels.SCRATCH.clear()
        pool.clear()
        fused.clear()


class observe:  # noqa: N801 - used as a context manager, like contextlib helpers
    """Call ``callback(op_type, output)`` after every wrapped compute op while the block runs.

    The doctor uses it to watch functional ops; the entry points must be wrapped (inside
    ``fp16_emulation`` or :func:`acquire`).
    """

    def __init__(self, callback: Callable[[str, Any], None]) -> None:
        self.callback = callback

    def __enter__(self) -> observe:
        _observers.append(self.callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        _observers.remove(self.callback)


def wrapped_paths() -> Dict[str, bool]:
    """Which entry points are wrapped now (for tests and diagnostics)."""
    return {f"{getattr(owner, '__name__', owner)}.{name}": hasattr(getattr(owner, name, None),
                                                                     "__paddle_amp_ext_original__")
            for owner, name, _, _ in _entry_points()}
