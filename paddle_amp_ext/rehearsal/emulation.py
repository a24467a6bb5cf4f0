"""fp16/bf16 dry run on any device: round what AMP would hold in low precision.

Under :func:`fp16_emulation`, values are rounded through the low-precision type where AMP
would compute in it (for float16 one pass of a compiled F16C kernel, else thirteen exact
float32 kernels; see :mod:`.rounding`), forward and backward: values below fp16's subnormal
range become 0 and values above 65504 become inf, exactly as fp16 storage would make them, so
underflow, overflow and loss scaling can be rehearsed on a CPU. The real Paddle scaler
machinery (``check_finite_and_unscale``, skip, update) runs inside the context.

Ops are rounded where they are called (:mod:`.ops`): ``paddle.matmul``, ``@``, ``einsum``,
``F.linear`` (so every ``nn.Linear``), ``F.conv2d``, and the "follow the inputs" ops after
them (``add``, ``relu``, ``reshape``, ...). Leaf layers whose kernels are reached only from C++
(``Conv2D``, ``BatchNorm2D``, ``Embedding``) are rounded by layer hooks: a white-listed one
takes rounded inputs and weights and gives a rounded output; one on the "follow the inputs"
path gives a rounded output when its inputs are low precision. The lists are those of the
innermost ``auto_cast`` entered inside the rehearsal, else the rehearsal's own.

This emulates storage range and rounding. It does not emulate kernel speed or the
accumulation order and precision inside fp16 matmul/conv kernels.

Example:
    >>> with fp16_emulation(model):  # doctest: +SKIP
    ...     loss = model(x).mean()
    ...     scaler.scale(loss).backward()
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import paddle

from .. import _compat, _state
from ..autocast import effective_op_lists
from ..config import AmpConfig
from ..keep import is_kept_fp32, keep_fp32, release_fp32, select_layers
from . import lowprec, ops
from .rounding import round_trip

#: Leaf layer classes and the op types eager AMP looks up for them.
LAYER_OPS: Dict[str, Tuple[str, ...]] = {
    "Linear": ("matmul_v2", "elementwise_add"),
    "Conv1D": ("conv2d",),
    "Conv2D": ("conv2d",),
    "Conv3D": ("conv3d",),
    "Conv1DTranspose": ("conv2d_transpose",),
    "Conv2DTranspose": ("conv2d_transpose",),
    "Conv3DTranspose": ("conv3d_transpose",),
    "Bilinear": ("bilinear_tensor_product",),
    "Embedding": ("lookup_table_v2",),
    "LayerNorm": ("layer_norm",),
    "GroupNorm": ("group_norm",),
    "BatchNorm1D": ("batch_norm",),
    "BatchNorm2D": ("batch_norm",),
    "BatchNorm3D": ("batch_norm",),
    "Softmax": ("softmax",),
    "LogSoftmax": ("log_softmax",),
    "ReLU": ("relu",),
    "GELU": ("gelu",),
    "Sigmoid": ("sigmoid",),
    "Tanh": ("tanh",),
    "Dropout": ("dropout",),
    "CrossEntropyLoss": ("softmax_with_cross_entropy",),
    "MSELoss": ("elementwise_sub", "square", "reduce_mean"),
}
EMULATED_DTYPES = ("float16", "bfloat16")
#: Leaf layers whose whole computation goes through an op-level entry point (``nn.Linear`` calls
#: ``F.linear``, ``nn.ReLU`` ``F.relu``, ...; checked on 2.6.2 and 3.3.1): :mod:`.ops` rounds
#: them, weights included, so they get no layer hooks.
OP_LEVEL_LAYERS = frozenset({"Linear", "ReLU", "GELU", "Sigmoid", "Tanh", "Dropout"})
#: Layers whose backward does not read their output: a large output is rounded in its own buffer.
OUTPUT_UNREAD_LAYERS = frozenset({"Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
                                  "Conv3DTranspose", "BatchNorm1D", "BatchNorm2D", "BatchNorm3D"})
#: Layers whose parameters AMP keeps in float32 even at O2 (Paddle's decorate keeps norms fp32).
FP32_PARAMETER_LAYERS = frozenset({"LayerNorm", "GroupNorm", "BatchNorm1D", "BatchNorm2D", "BatchNorm3D"})


def quantize(tensor: Any, dtype: str = "float16") -> Any:
    """Round a float32 tensor through ``dtype`` and back (differentiable); others unchanged."""
    if isinstance(tensor, paddle.Tensor) and tensor.dtype == paddle.float32:
        return round_trip(tensor, dtype)
    if isinstance(tensor, (list, tuple)):
        return type(tensor)(quantize(t, dtype) for t in tensor)
    return tensor


def classify_layers(model: paddle.nn.Layer, white: frozenset, black: frozenset, level: str = "O1"
                    ) -> Tuple[List[Tuple[str, paddle.nn.Layer]], List[Tuple[str, paddle.nn.Layer]]]:
    """Leaf layers of :data:`LAYER_OPS` AMP would run in low precision whatever their inputs,
    and those on the "follow the inputs" path (neither list); keep-fp32 subtrees excluded."""
    low: List[Tuple[str, paddle.nn.Layer]] = []
    follow: List[Tuple[str, paddle.nn.Layer]] = []

    def visit(prefix: str, layer: paddle.nn.Layer) -> None:
        if is_kept_fp32(layer):
            return
        children = list(layer.named_children())
        if children:
            for name, child in children:
                visit(f"{prefix}.{name}" if prefix else name, child)
            return
        ops = set(LAYER_OPS.get(type(layer).__name__, ()))
        if not ops or ops & black:
            return
        (low if level == "O2" or ops & white else follow).append((prefix, layer))

    visit("", model)
    return low, follow


@contextlib.contextmanager
def fp16_emulation(model: paddle.nn.Layer, dtype: str = "float16", *, level: str = "O1",
                   config: Optional[AmpConfig] = None, custom_white_list: Any = None,
                   custom_black_list: Any = None) -> Iterator[List[str]]:
    """Emulate ``dtype`` storage for ``model`` on any device; yields the emulated layer names.

    Args:
        model: the model; it is unchanged after the context (hooks are removed, layers kept in
            float32 for ``config.fp32_layers`` are released, and Paddle's global AMP dtype is
            what it was).
        dtype: ``"float16"`` or ``"bfloat16"``.
        level, custom_white_list, custom_black_list, config: as for ``auto_cast``; they pick
            the layers that are emulated.

    The rehearsal belongs to the thread that enters it: a GradScaler in another thread does not
    see it. Paddle's global AMP dtype (which Paddle's own scaler reads) is process-wide: set to
    ``dtype`` inside, restored to exactly what it was at exit.

    Raises:
        TypeError: ``model`` is not a ``paddle.nn.Layer``.
        ValueError: an unsupported dtype, or a bad op list.
    """
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"fp16_emulation expects the model (a paddle.nn.Layer). Received: {model!r} "
                        f"(of type {type(model).__name__})")
    if dtype not in EMULATED_DTYPES:
        raise ValueError(f"fp16_emulation dtype must be one of {EMULATED_DTYPES}. Received: dtype={dtype!r}")
    previous = _compat.amp_state_dtype()  # before anything below enters Paddle's auto_cast
    kept = []  # layers kept in float32 for this context only (config.fp32_layers)
    if config is not None and config.fp32_layers:
        kept = [layer for layer in select_layers(model, config.fp32_layers) if not is_kept_fp32(layer)]
        for layer in kept:
            keep_fp32(layer)
    white, black = effective_op_lists(dtype, level, config, custom_white_list, custom_black_list)
    low, follow = classify_layers(model, white, black, config.level if config else level)
    with _rehearsal_scope(dtype, (white, black, config.level if config else level), previous):
        try:
            yield from _hooked(low, follow, dtype)
        finally:
            for layer in kept:
                release_fp32(layer)


@contextlib.contextmanager
def _rehearsal_scope(dtype: str, lists: Any, previous: str) -> Iterator[None]:
    """This thread rehearses ``dtype`` with ``lists``: the scaler runs, functional ops are rounded."""
    _compat.set_amp_state_dtype(dtype)  # what Paddle's own scaler checks in scale()
    token = _state.push_emulation(dtype, lists)
    ops.acquire()
    try:
        yield
    finally:
        ops.release()
        _state.pop_emulation(token)
        _compat.set_amp_state_dtype(previous)


class _WeightSwap:
    """A white-listed layer's own float32 parameters, rounded for the length of its forward (AMP
    casts them per op); the parameters come back after the forward, or at the latest when the
    rehearsal ends."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.swapped: Dict[int, Tuple[paddle.nn.Layer, Dict[str, Any]]] = {}

    def enter(self, layer: paddle.nn.Layer) -> None:
        self.leave(layer)  # a forward that raised left its rounded weights behind
        params = layer._parameters  # noqa: SLF001 - Layer.__getattr__ reads parameters from here
        originals = {name: p for name, p in params.items() if p is not None and p.dtype == paddle.float32}
        for name, param in originals.items():
            params[name] = lowprec.mark(round_trip(param, self.dtype), self.dtype)
        self.swapped[id(layer)] = (layer, originals)

    def leave(self, layer: paddle.nn.Layer) -> None:
        entry = self.swapped.pop(id(layer), None)
        if entry is not None:
            entry[0]._parameters.update(entry[1])  # noqa: SLF001

    def leave_all(self) -> None:
        for layer, _ in list(self.swapped.values()):
            self.leave(layer)


def _hooked(low: List[Tuple[str, paddle.nn.Layer]], follow: List[Tuple[str, paddle.nn.Layer]],
            dtype: str) -> Iterator[List[str]]:
    """Layer-path hooks while the caller's ``with`` block runs; yields the low layers' names."""
    handles: List[Any] = []
    weights = _WeightSwap(dtype)

    def pre_hook(layer: Any, inputs: Any) -> Any:
        if not _compat.runs_eagerly():
            return None
        if type(layer).__name__ not in FP32_PARAMETER_LAYERS:
            weights.enter(layer)
        return lowprec.rounded(inputs, dtype)

    def rounded_output(layer: Any, inputs: Any, output: Any) -> Any:
        args = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
        fresh = type(layer).__name__ in OUTPUT_UNREAD_LAYERS and not any(output is item for item in args)
        return lowprec.rounded(output, dtype, in_place=fresh)

    def post_hook(layer: Any, inputs: Any, output: Any) -> Any:
        if not _compat.runs_eagerly():
            return None
        weights.leave(layer)
        return rounded_output(layer, inputs, output)

    def follow_hook(layer: Any, inputs: Any, output: Any) -> Any:
        args = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
        if not _compat.runs_eagerly() or not lowprec.all_low(args, dtype):
            return output
        return rounded_output(layer, inputs, output)

    try:
        for _, layer in low:
            if type(layer).__name__ in OP_LEVEL_LAYERS:
                continue
            handles.append(layer.register_forward_pre_hook(pre_hook))
            handles.append(layer.register_forward_post_hook(post_hook))
        for _, layer in follow:
            if type(layer).__name__ not in OP_LEVEL_LAYERS:
                handles.append(layer.register_forward_post_hook(follow_hook))
        yield [name for name, _ in low]
    finally:
        for handle in handles:
            handle.remove()
        weights.leave_all()


@contextlib.contextmanager
def rehearse(dtype: str = "float16", *, level: str = "O1", config: Optional[AmpConfig] = None,
             custom_white_list: Any = None, custom_black_list: Any = None) -> Iterator[None]:
    """Rehearse ``dtype`` for whatever runs in the block, with no model to name.

    The op-level part of :func:`fp16_emulation`: ops called through Paddle's Python API
    (``paddle.matmul``, ``@``, ``paddle.einsum``, ``F.linear`` and so every ``nn.Linear``,
    ``F.conv2d``, and the "follow the inputs" ops after them) are rounded, and the GradScaler
    runs its real machinery. Leaf layers reached only from C++ (``Conv2D``, ``BatchNorm2D``)
    are rounded only by ``fp16_emulation(model)``. ``python -m paddle_amp_ext.run --emulate``
    uses this for a script.

    Raises:
        ValueError: an unsupported dtype, or a bad op list.
    """
    if dtype not in EMULATED_DTYPES:
        raise ValueError(f"rehearse dtype must be one of {EMULATED_DTYPES}. Received: dtype={dtype!r}")
    previous = _compat.amp_state_dtype()
    white, black = effective_op_lists(dtype, level, config, custom_white_list, custom_black_list)
    with _rehearsal_scope(dtype, (white, black, config.level if config else level), previous):
        yield
