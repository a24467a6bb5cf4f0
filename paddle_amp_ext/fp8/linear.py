"""Any Paddle model's ``nn.Linear`` layers run as FP8 linears under a recipe, on a CPU.

Recipes (:class:`Fp8Recipe`):

- ``"blockwise"`` (DeepSeek-V3, PaddleFormers' ``fp8_utils``): inputs and output gradients in
  1x128 blocks along the dimension each GEMM contracts, weights in 128x128 blocks, all e4m3fn,
  power-of-2 scales (the arithmetic of :mod:`.kernels`);
- ``"current"`` (Transformer Engine's current scaling): one scale per tensor from its own amax,
  ``max / amax``; e4m3fn forward, e5m2 output gradients (TE's HYBRID format);
- ``"delayed"`` (Transformer Engine's delayed scaling): one scale per tensor from the largest amax
  of the last ``amax_history_len`` steps (``max / amax / 2**margin``), starting at 1; the current
  amax joins the history after the tensor is quantized, so an amax that grows saturates once.

Each GEMM multiplies the dequantized FP8 operands in float32 (as cuBLASLt computes with float32
accumulation); the bias is added in float32. Shapes need not be multiples of 128: blocks are
padded with zeros, which changes neither an amax nor a product.

Example:
    >>> model = paddle.nn.Sequential(paddle.nn.Linear(256, 256))   # doctest: +SKIP
    >>> with fp8_linears(model, "current") as stats:                # doctest: +SKIP
    ...     model(x).mean().backward()
    >>> stats.worst()                                               # doctest: +SKIP
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import paddle

from .blocks import Quantized, quantize_blocks
from .formats import fp8_format
from .kernels import BLOCK, scale_from_amax
from .stats import Fp8Stats

SCALINGS = ("blockwise", "current", "delayed")


@dataclass(frozen=True)
class Fp8Recipe:
    """How FP8 linears quantize. Strings are accepted wherever a recipe is (``"blockwise"``).

    Attributes:
        scaling: ``"blockwise"``, ``"current"`` or ``"delayed"``.
        fmt: format of inputs and weights (``"e4m3fn"``).
        grad_fmt: format of output gradients; default e4m3fn for blockwise, e5m2 otherwise.
        epsilon: lower bound of the amax a scale is computed from (Paddle's ``epsilon``).
        pow2: power-of-2 scales; default True for blockwise, False otherwise.
        amax_history_len: steps of amax the delayed recipe remembers.
        margin: the delayed recipe's scale is divided by ``2**margin``.
    """

    scaling: str = "blockwise"
    fmt: str = "e4m3fn"
    grad_fmt: Optional[str] = None
    epsilon: float = 0.0
    pow2: Optional[bool] = None
    amax_history_len: int = 16
    margin: int = 0

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}. Received: scaling={self.scaling!r}")
        object.__setattr__(self, "fmt", fp8_format(self.fmt).name)
        grad = self.grad_fmt if self.grad_fmt is not None else ("e4m3fn" if self.scaling == "blockwise" else "e5m2")
        object.__setattr__(self, "grad_fmt", fp8_format(grad).name)
        if self.pow2 is None:
            object.__setattr__(self, "pow2", self.scaling == "blockwise")
        if not isinstance(self.epsilon, (int, float)) or isinstance(self.epsilon, bool) or not (
                np.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon must be a finite number >= 0. Received: epsilon={self.epsilon!r}")
        for name in ("amax_history_len", "margin"):
            value = getattr(self, name)
            low = 1 if name == "amax_history_len" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}. Received: {name}={value!r}")

    @classmethod
    def of(cls, recipe: Union[Fp8Recipe, str]) -> Fp8Recipe:
        """``recipe`` as an :class:`Fp8Recipe` (a string names the scaling)."""
        if isinstance(recipe, Fp8Recipe):
            return recipe
        if isinstance(recipe, str):
            return cls(scaling=recipe)
        raise TypeError(f"recipe must be an Fp8Recipe or one of {SCALINGS}. Received: {recipe!r} "
                        f"(of type {type(recipe).__name__})")


@dataclass
class _LayerState:
    name: str
    recipe: Fp8Recipe
    stats: Optional[Fp8Stats]
    history: Dict[str, collections.deque] = field(default_factory=dict)
    scale: Dict[str, np.float32] = field(default_factory=dict)

    def dequant(self, a: np.ndarray, role: str, along: str) -> paddle.Tensor:
        """``a`` [R, C] as the recipe stores it, back in float32. ``along``: ``"rows"`` (1x128
        blocks along C), ``"rows_quiet"`` (the same, not recorded: the second quantization of a
        tensor in a step) or ``"tiles"`` (128x128). One pass of the compiled kernel rounds,
        counts and finds the amax (:mod:`.blocks`); a blockwise or current scale needs the
        amax first, one more pass. The values are written straight into the returned tensor's
        memory on a CPU (:func:`_float32_tensor`)."""
        r = self.recipe
        fmt = r.grad_fmt if role == "output_grad" else r.fmt
        if r.scaling == "blockwise":
            block = (BLOCK, BLOCK) if along == "tiles" else (1, BLOCK)
        else:
            block = (max(a.shape[0], 1), max(a.shape[1], 1))  # one scale for the tensor
        tensor, view = _float32_tensor(a.shape)
        if r.scaling == "delayed":
            scales = np.array([[self.scale.get(role, np.float32(1.0))]], np.float32)
        else:  # the amax, then the scales, in the kernel's same call
            scales = None if a.size else np.ones((1, 1) if r.scaling == "current" else (0, 0), np.float32)
        if a.size:
            out = quantize_blocks(a, block, scales, fmt, out=view, epsilon=r.epsilon, pow2=r.pow2)
        else:
            out = Quantized(view, 0, 0, 0.0, scales)
        if self.stats is not None and along != "rows_quiet":  # one record per tensor and step
            self.stats.add_counts(self.name, role, fmt, out.saturated, out.flushed, a.size, out.amax,
                                  out.scales.ravel())
        if r.scaling == "delayed":
            hist = self.history.setdefault(role, collections.deque(maxlen=r.amax_history_len))
            hist.append(out.amax)
            top = max(hist)
            if np.isfinite(top) and top > 0:
                self.scale[role] = np.float32(scale_from_amax(np.float32(top), r.epsilon, r.pow2, fmt)
                                              / np.float32(2.0**r.margin))
        return tensor if tensor is not None else paddle.to_tensor(out.values)


#: Below this many values ``paddle.to_tensor``'s copy costs less than ``paddle.empty``'s call.
_VIEW_FROM = 1 << 16


def _float32_tensor(shape: Tuple[int, int]) -> Tuple[Optional[paddle.Tensor], np.ndarray]:
    """A new float32 tensor and a numpy view of its memory (``Tensor.data_ptr()``) to write it
    through, without the copy of ``paddle.to_tensor``; where the default device is not the CPU
    (or the tensor is small or empty), None and a numpy array that :meth:`_LayerState.dequant`
    copies over."""
    if shape[0] * shape[1] < _VIEW_FROM or paddle.device.get_device() != "cpu":
        return None, np.zeros(shape, np.float32)
    tensor = paddle.empty(list(shape), "float32")
    buffer = (ctypes.c_float * (shape[0] * shape[1])).from_address(tensor.data_ptr())
    return tensor, np.ctypeslib.as_array(buffer).reshape(shape)  # alive while the tensor is: the caller keeps both


def _matmul(a: paddle.Tensor, b: paddle.Tensor, transpose_x: bool = False, transpose_y: bool = False):
    """``paddle.matmul``, and zeros for an empty operand (Paddle 2.6's matmul refuses those)."""
    if 0 in a.shape or 0 in b.shape:
        rows = a.shape[1] if transpose_x else a.shape[0]
        cols = b.shape[0] if transpose_y else b.shape[1]
        return paddle.zeros([rows, cols], "float32")
    return paddle.matmul(a, b, transpose_x=transpose_x, transpose_y=transpose_y)


def _host(t: paddle.Tensor, cols: int) -> np.ndarray:
    """``t`` as a float32 ``[-1, cols]`` numpy array: a view of its memory (``Tensor.data_ptr()``)
    where ``t`` is a large contiguous float32 CPU tensor (valid only while ``t`` lives and is not
    written: for operands used inside one call), else a copy (``.numpy()``, which syncs)."""
    n = math.prod(t.shape)
    if (n >= _VIEW_FROM and t.dtype == paddle.float32 and t.place.is_cpu_place() and t.is_contiguous()
            and not getattr(t, "is_dist", lambda: False)()):
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(t.data_ptr())).reshape(-1, cols)
    return t.reshape([-1, cols]).astype("float32").numpy()


class _Fp8LinearFn(paddle.autograd.PyLayer):
    """The GEMMs by Paddle's float32 CPU matmul on the dequantized operands (float32 accumulation;
    numpy's threaded BLAS ran 40 times slower next to Paddle's threads on a busy machine)."""

    @staticmethod
    def forward(ctx, x, weight, *bias_and_state):  # noqa: D102
        *bias, state = bias_and_state
        shape = list(x.shape)
        x2 = x.reshape([-1, shape[-1]]).astype("float32").numpy()
        w = _host(weight, weight.shape[-1])  # used only inside this call: a view where it can be
        xq = state.dequant(x2, "input", "rows")
        wq = state.dequant(w, "weight", "tiles" if state.recipe.scaling == "blockwise" else "rows")
        if x2.shape[0] == 0:  # an empty batch: Paddle 2.6's ops refuse empty operands
            y = paddle.to_tensor(np.zeros([0, w.shape[1]], np.float32))
        else:
            y = _matmul(xq, wq)
            if bias:
                y = y + bias[0].astype("float32")
        ctx.state, ctx.wq, ctx.shape, ctx.has_bias = state, wq, shape, bool(bias)
        # per-tensor recipes quantize x the same way whichever dimension a GEMM contracts
        ctx.x2 = x2 if state.recipe.scaling == "blockwise" else xq
        ctx.dtypes = (x.dtype, weight.dtype)
        ctx.wanted = [not t.stop_gradient for t in (x, weight, *bias)]
        return y.reshape(shape[:-1] + [w.shape[1]]).astype(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        state = ctx.state
        g = _host(dy, dy.shape[-1])  # dy lives through this call
        gq = state.dequant(g, "output_grad", "rows")
        dx = _matmul(gq, ctx.wq, transpose_y=True)  # contracts N: blocks along N
        if state.recipe.scaling == "blockwise":  # dw = x^T dy contracts the tokens: blocks along the tokens
            xt = state.dequant(np.ascontiguousarray(ctx.x2.T), "input", "rows_quiet")
            gt = state.dequant(np.ascontiguousarray(g.T), "output_grad", "rows_quiet")
            dw = _matmul(xt, gt, transpose_y=True)
        else:  # one scale per tensor: the quantized x and dy of the other GEMMs
            dw = _matmul(ctx.x2, gq, transpose_x=True)
        if g.shape[0] == 0:
            dx = paddle.to_tensor(np.zeros([0, ctx.shape[-1]], np.float32))
        grads = [dx.reshape(ctx.shape).astype(ctx.dtypes[0]), dw.astype(ctx.dtypes[1])]
        if ctx.has_bias:
            grads.append(paddle.to_tensor(g.sum(axis=0).astype(np.float32)))
        return tuple(grad if wanted else None for grad, wanted in zip(grads, ctx.wanted))


def fp8_linear(x: paddle.Tensor, weight: paddle.Tensor, bias: Optional[paddle.Tensor], state: _LayerState):
    """``x @ weight + bias`` with both GEMMs (and the backward's two) in FP8 under ``state``'s recipe."""
    if bias is None:
        return _Fp8LinearFn.apply(x, weight, state)
    return _Fp8LinearFn.apply(x, weight, bias, state)


def _forward(layer: paddle.nn.Linear, state: _LayerState) -> Callable:
    return lambda x: fp8_linear(x, layer.weight, layer.bias, state)


def _linears(model: paddle.nn.Layer) -> List[Tuple[str, paddle.nn.Linear]]:
    return [(name or type(model).__name__, layer) for name, layer in model.named_sublayers(include_self=True)
            if isinstance(layer, paddle.nn.Linear)]


@contextlib.contextmanager
def fp8_linears(model: paddle.nn.Layer, recipe: Union[Fp8Recipe, str] = "blockwise", *,
                exclude: Sequence[str] = (), stats: Optional[Fp8Stats] = None,
                record: bool = True) -> Iterator[Fp8Stats]:
    """Run ``model``'s ``nn.Linear`` layers as FP8 linears inside the block; yields the stats.

    Args:
        model: any Paddle layer; its ``nn.Linear`` sublayers (named as ``named_sublayers`` names
            them) are switched, others are untouched.
        recipe: an :class:`Fp8Recipe` or ``"blockwise"``/``"current"``/``"delayed"``.
        exclude: names of linears kept in their own precision (the advisor's
            ``fp8_exclude_layers``); a name that is not a linear of ``model`` is an error.
        stats: an :class:`Fp8Stats` to append to (its delayed-scaling history lives in the layers'
            states, kept across blocks for the same model); a new one by default.
        record: False skips the saturated/flushed counts (about a tenth of the FP8 step's cost);
            the yielded stats stay empty.

    Raises:
        ValueError: ``exclude`` names a layer the model does not have.

    The FP8 linears compute in numpy and sync to host; on exit every layer's forward is the
    original one again, so nothing remains on the step when FP8 is off.
    """
    recipe = Fp8Recipe.of(recipe)
    if not isinstance(record, bool):
        raise TypeError(f"record must be True or False. Received: record={record!r}")
    layers = _linears(model)
    names = {name for name, _ in layers}
    unknown = sorted(set(exclude) - names)
    if unknown:
        raise ValueError(f"exclude names {unknown}, which are not nn.Linear layers of this model; "
                         f"its linears are {sorted(names)}")
    stats = stats if stats is not None else Fp8Stats()
    switched = []
    try:
        for name, layer in layers:
            if name in exclude:
                continue
            state = layer.__dict__.get("_amp_fp8_state")
            if state is None or state.recipe != recipe:
                state = _LayerState(name, recipe, stats)
                layer.__dict__["_amp_fp8_state"] = state
            state.stats = stats if record else None
            layer.__dict__["forward"] = _forward(layer, state)
            switched.append(layer)
        yield stats
    finally:
        for layer in switched:
            layer.__dict__.pop("forward", None)
