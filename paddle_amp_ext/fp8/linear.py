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
import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import paddle

from .._native import fp8_kernel
from ._buffers import Buffer, BufferPool, as_tensor, host, new_float32
from .blocks import Quantized, quantize_both, quantize_into, scale_from_amax
from .formats import fp8_format
from .kernels import BLOCK
from .stats import ROLES, Fp8Stats

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
            return _recipe_named(recipe)
        raise TypeError(f"recipe must be an Fp8Recipe or one of {SCALINGS}. Received: {recipe!r} "
                        f"(of type {type(recipe).__name__})")


@functools.lru_cache(maxsize=8)
def _recipe_named(scaling: str) -> Fp8Recipe:
    return Fp8Recipe(scaling=scaling)  # frozen: one per name (a bad name raises and is not cached)


@dataclass
class _LayerState:
    name: str
    recipe: Fp8Recipe
    stats: Optional[Fp8Stats]
    history: Dict[str, collections.deque] = field(default_factory=dict)
    scale: Dict[str, np.float32] = field(default_factory=dict)

    def __post_init__(self) -> None:  # what every quantization of the layer needs, looked up once
        r = self.recipe
        self.formats = {role: fp8_format(r.grad_fmt if role == "output_grad" else r.fmt) for role in ROLES}
        self.epsilon, self.pow2 = float(r.epsilon), bool(r.pow2)
        self.blocks = {"rows": (1, BLOCK), "tiles": (BLOCK, BLOCK), "columns_quiet": (BLOCK, 1)} if (
            r.scaling == "blockwise") else None  # None: one scale per tensor
        self.delayed = r.scaling == "delayed"
        self.buffers = BufferPool()

    def dequant(self, a: np.ndarray, role: str, along: str, out: Buffer, address: Optional[int] = None
                ) -> paddle.Tensor:
        """``a`` [R, C] (C-contiguous float32) as the recipe stores it, back in float32, written
        into ``out`` (a tensor and a view of its memory, :mod:`._buffers`; ``a`` may be that
        view: quantized in place). ``along``: ``"rows"`` (1x128 blocks along C), ``"tiles"``
        (128x128) or ``"columns_quiet"`` (128x1 blocks along R, not recorded: the second
        quantization of a tensor in a step); ``address``: ``a``'s first value's, where known.
        One call of the compiled kernel finds the amax, the scales, rounds and counts
        (:mod:`.blocks`)."""
        spec = self.formats[role]
        block = self.blocks[along] if self.blocks is not None else (max(a.shape[0], 1), max(a.shape[1], 1))
        if self.delayed:
            scales = np.array([[self.scale.get(role, np.float32(1.0))]], np.float32)
        else:  # the amax, then the scales, in the kernel's same call
            scales = None if a.size else np.ones((0, 0) if self.blocks is not None else (1, 1), np.float32)
        if a.size:
            both = None if address is None or out[0] is None else (address, out[0].data_ptr())
            done = quantize_into(a, block, scales, spec, out[1], True, self.epsilon, self.pow2, fp8_kernel(), both)
        else:
            done = Quantized(out[1], 0, 0, 0.0, scales)
        if along != "columns_quiet":  # one record per tensor and step
            self._record(role, spec.name, a.size, done)
        if self.delayed:
            r = self.recipe
            hist = self.history.setdefault(role, collections.deque(maxlen=r.amax_history_len))
            hist.append(done.amax)
            top = max(hist)
            if math.isfinite(top) and top > 0:
                self.scale[role] = _delayed_scale(top, self.epsilon, self.pow2, spec.name, r.margin)
        return as_tensor(out)

    def dequant_both(self, a: np.ndarray, role: str, out: Buffer, out_columns: Buffer, address: Optional[int] = None
                     ) -> Tuple[paddle.Tensor, paddle.Tensor]:
        """:meth:`dequant` along ``"rows"`` into ``out`` and along ``"columns_quiet"`` into
        ``out_columns`` (blockwise recipes only), in one call of the kernel (:func:`.blocks.quantize_both`)."""
        kernel = fp8_kernel()
        if not a.size or kernel is None:
            return (self.dequant(a, role, "rows", out, address),
                    self.dequant(a, role, "columns_quiet", out_columns, address))
        spec = self.formats[role]
        addresses = None if address is None or out[0] is None or out_columns[0] is None else (
            address, out[0].data_ptr(), out_columns[0].data_ptr())
        done, scale_range = quantize_both(a, BLOCK, spec, out[1], out_columns[1], self.epsilon, self.pow2, kernel,
                                          addresses)
        self._record(role, spec.name, a.size, done, scale_range)
        return as_tensor(out), as_tensor(out_columns)

    def _record(self, role: str, fmt: str, count: int, done: Quantized,
                scale_range: Optional[Tuple[float, float]] = None) -> None:
        if self.stats is not None:
            self.stats.add_counts(self.name, role, fmt, done.saturated, done.flushed, count, done.amax, done.scales,
                                  scale_range=scale_range)


@functools.lru_cache(maxsize=4096)
def _delayed_scale(top: float, epsilon: float, pow2: bool, fmt: str, margin: int) -> np.float32:
    """The delayed recipe's scale from the history's largest amax (the history's top changes
    seldom: looked up, not recomputed, on most steps)."""
    return np.float32(scale_from_amax(np.float32(top), epsilon, pow2, fmt) / np.float32(2.0**margin))


def _as_dtype(t: paddle.Tensor, dtype) -> paddle.Tensor:
    return t if t.dtype == dtype else t.astype(dtype)


def _add_bias(y: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
    """``y + bias`` in float32 (one rounding per value, as Paddle's add), written into ``y`` (a
    new float32 tensor of this call) through a view where it is a CPU tensor: Paddle's broadcast
    add cost about 30 us on a 64 x 512 output, numpy's in place a few."""
    out, at = host(y, y.shape[-1])
    if at is None:  # a copy: adding to it would not reach y
        return y + bias.astype("float32")
    out += host(bias, out.shape[1])[0][0]
    return y


def _matmul(a: paddle.Tensor, b: paddle.Tensor, transpose_x: bool = False, transpose_y: bool = False):
    """``paddle.matmul``, and zeros for an empty operand (Paddle 2.6's matmul refuses those)."""
    if 0 in a.shape or 0 in b.shape:
        rows = a.shape[1] if transpose_x else a.shape[0]
        cols = b.shape[0] if transpose_y else b.shape[1]
        return paddle.zeros([rows, cols], "float32")
    return paddle.matmul(a, b, transpose_x=transpose_x, transpose_y=transpose_y)


class _Fp8LinearFn(paddle.autograd.PyLayer):
    """The GEMMs by Paddle's float32 CPU matmul on the dequantized operands (float32 accumulation;
    numpy's threaded BLAS ran 40 times slower next to Paddle's threads on a busy machine). The
    operands are read through views of the tensors' memory inside each call, the quantized ones
    written into the layer's reused tensors (:mod:`._buffers`); what the backward needs of ``x``
    is kept in one of those (the quantized ``x``; for blockwise ``x`` quantized in 128x1 blocks
    too, along the tokens that the weight gradient's GEMM contracts)."""

    @staticmethod
    def forward(ctx, x, weight, *bias_and_state):  # noqa: D102
        *bias, state = bias_and_state
        shape = list(x.shape)
        x2, x_at = host(x, shape[-1])  # views where they can be: used only inside this call
        w, w_at = host(weight, weight.shape[-1])
        blockwise = state.recipe.scaling == "blockwise"
        take = state.buffers.take
        ctx.wanted = [not t.stop_gradient for t in (x, weight, *bias)]
        # per-tensor recipes quantize x the same way whichever dimension a GEMM contracts;
        # blockwise quantizes it along the tokens too for dw, now (x may change after this call)
        if blockwise and ctx.wanted[1]:
            xq, ctx.x = state.dequant_both(x2, "input", take("input", x2.shape), take("input_columns", x2.shape), x_at)
        else:
            xq = ctx.x = state.dequant(x2, "input", "rows", take("input", x2.shape), x_at)
            if blockwise:
                ctx.x = None
        wq = state.dequant(w, "weight", "tiles" if blockwise else "rows", take("weight", w.shape), w_at)
        if x2.shape[0] == 0:  # an empty batch: Paddle 2.6's ops refuse empty operands
            y = paddle.to_tensor(np.zeros([0, w.shape[1]], np.float32))
        else:
            y = paddle.matmul(xq, wq)
            if bias:
                y = _add_bias(y, bias[0])
        ctx.state, ctx.wq, ctx.shape, ctx.has_bias = state, wq, shape, bool(bias)
        ctx.dtypes = (x.dtype, weight.dtype)
        if len(shape) != 2:
            y = y.reshape(shape[:-1] + [w.shape[1]])
        return y if x.dtype == y.dtype else y.astype(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        state, wanted = ctx.state, ctx.wanted
        g, g_at = host(dy, dy.shape[-1])  # dy lives through this call
        take = state.buffers.take
        # blockwise dw = x^T dy contracts the tokens: dy in blocks along the tokens too
        if state.recipe.scaling == "blockwise" and wanted[1]:
            gq, gc = state.dequant_both(g, "output_grad", take("output_grad", g.shape),
                                        take("output_grad_columns", g.shape), g_at)
        else:  # per-tensor recipes: the quantized x and dy of the other GEMMs
            gq = gc = state.dequant(g, "output_grad", "rows", take("output_grad", g.shape), g_at)
        grads = [None] * len(wanted)
        if wanted[0]:
            if g.shape[0] == 0:
                dx = paddle.to_tensor(np.zeros([0, ctx.shape[-1]], np.float32))
            else:
                dx = _matmul(gq, ctx.wq, transpose_y=True)  # contracts N: blocks along N
            grads[0] = _as_dtype(dx if len(ctx.shape) == 2 else dx.reshape(ctx.shape), ctx.dtypes[0])
        if wanted[1]:
            dw = _matmul(ctx.x, gc, transpose_x=True)
            grads[1] = _as_dtype(dw, ctx.dtypes[1])
        if ctx.has_bias and wanted[2]:  # a new tensor, not a pooled one: Paddle may keep a gradient as .grad
            db, view = new_float32((1, g.shape[1]))
            np.sum(g, axis=0, dtype=np.float32, out=view[0])
            grads[2] = db.reshape([g.shape[1]]) if db is not None else paddle.to_tensor(view[0])
        return tuple(grads)


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
            if state is None or (state.recipe is not recipe and state.recipe != recipe):
                state = _LayerState(name, recipe, stats)
                layer.__dict__["_amp_fp8_state"] = state
            state.stats = stats if record else None
            layer.__dict__["forward"] = _forward(layer, state)
            switched.append(layer)
        yield stats
    finally:
        for layer in switched:
            layer.__dict__.pop("forward", None)
