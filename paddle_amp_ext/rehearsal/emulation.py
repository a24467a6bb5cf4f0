"""fp16/bf16 dry run on any device: round what AMP would hold in low precision.

Under :func:`fp16_emulation` (one model) or :func:`rehearse` (the whole thread) the values AMP
would compute in low precision are rounded through it, forward and backward, so underflow,
overflow and loss scaling can be rehearsed on a CPU; Paddle's scaler machinery runs inside. It
emulates storage range and rounding, not kernel speed or accumulation order. Which ops and
layers are rounded, and where: "Notes for maintainers" in the docs.

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
from .pure import HeldParameters, WeightSwap
from .rounding import round_trip
from .scope import model_scope

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
#: Leaf layers whose whole computation goes through op-level entry points (``nn.Linear`` calls
#: ``F.linear``, ``nn.Conv2D`` ``F.conv._conv_nd``, ``nn.Embedding`` ``F.embedding``, ``nn.ReLU``
#: ``F.relu``, ...; checked on 2.6.2 and 3.3.1): :mod:`.ops` rounds them, weights included, so they
#: get no layer hooks.
OP_LEVEL_LAYERS = frozenset({"Linear", "ReLU", "GELU", "Sigmoid", "Tanh", "Dropout", "Conv1D", "Conv2D", "Conv3D",
                             "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "Embedding", "LayerNorm",
                             "BatchNorm1D", "BatchNorm2D", "BatchNorm3D"})


def quantize(tensor: Any, dtype: str = "float16") -> Any:
    """Round a float32 tensor through ``dtype`` and back (differentiable); others unchanged.

    Args:
        tensor: a tensor, or a list or tuple of them (rounded one by one).
        dtype: ``"float16"`` or ``"bfloat16"``.

    Returns:
        A float32 tensor holding the values ``dtype`` storage would hold (round to nearest
            even; 1e-8 -> 0 and 65520 -> inf in float16); anything else as it was.
    """
    if isinstance(tensor, paddle.Tensor) and tensor.dtype == paddle.float32:
        return round_trip(tensor, dtype)
    if isinstance(tensor, (list, tuple)):
        return type(tensor)(quantize(t, dtype) for t in tensor)
    return tensor


def classify_layers(model: paddle.nn.Layer, white: frozenset, black: frozenset, level: str = "O1",
                    promote: bool = True
                    ) -> Tuple[List[Tuple[str, paddle.nn.Layer]], List[Tuple[str, paddle.nn.Layer]]]:
    """Leaf layers of :data:`LAYER_OPS` AMP would run in low precision whatever their inputs
    (white-listed; at O2 with ``use_promote=False`` every one not black-listed), and those on
    the "follow the inputs" path; keep-fp32 subtrees excluded."""
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
        names = tuple(LAYER_OPS.get(type(layer).__name__, ()))
        if not names or set(names) & black:
            return
        (low if ops.runs_low(names, _state.Lists(white, black, level, promote)) else follow).append((prefix, layer))

    visit("", model)
    return low, follow


@contextlib.contextmanager
def fp16_emulation(model: paddle.nn.Layer, dtype: str = "float16", *, level: str = "O1",
                   config: Optional[AmpConfig] = None, custom_white_list: Any = None,
                   custom_black_list: Any = None, use_promote: bool = True) -> Iterator[List[str]]:
    """Emulate ``dtype`` storage for ``model`` on any device; yields the names of the layers the
    lists alone run in low precision (the others follow their inputs).

    Rounding is confined to ``model``: its forward (every call of it or of one of its
    sublayers, nested ones and a gradient-checkpointing recompute included) rounds what AMP
    would; an op outside it rounds only where all its float inputs already hold ``dtype``
    values (as on a GPU, where fp16 tensors stay fp16), so a second model used in the same
    thread on float32 inputs (a teacher, an EMA copy) runs in float32. :func:`rehearse`
    rounds every op of the thread instead.

    Args:
        model: the model; it is unchanged after the context (hooks are removed, layers kept in
            float32 for ``config.fp32_layers`` are released, and Paddle's global AMP dtype is
            what it was), except that a ``decorate(level="O2")`` made inside leaves its
            parameters rounded, as the cast to fp16 would.
        dtype: ``"float16"`` or ``"bfloat16"``.
        level: as for :func:`paddle_amp_ext.auto_cast`; an ``auto_cast`` entered inside with
            other lists or another level takes over for its block, as on a GPU.
        custom_white_list: as for :func:`paddle_amp_ext.auto_cast`.
        custom_black_list: as for :func:`paddle_amp_ext.auto_cast`.
        use_promote: as for :func:`paddle_amp_ext.auto_cast`.
        config: an :class:`paddle_amp_ext.AmpConfig` supplying dtype, level and the lists.

    The rehearsal belongs to the thread that enters it: a GradScaler in another thread does not
    see it. Paddle's global AMP dtype (which Paddle's own scaler reads) is process-wide: set to
    ``dtype`` inside, restored to exactly what it was at exit.

    Returns:
        A context manager yielding the names of the layers the lists alone run in low precision.

    Raises:
        TypeError: ``model`` is not a ``paddle.nn.Layer``.
        ValueError: an unsupported dtype, or a bad op list.
    """
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"fp16_emulation expects the model (a paddle.nn.Layer). Received: {model!r} "
                        f"(of type {type(model).__name__})")
    _check_dtype("fp16_emulation", dtype)
    previous = _compat.amp_state_dtype()  # before anything below enters Paddle's auto_cast
    kept = []  # layers kept in float32 for this context only (config.fp32_layers)
    if config is not None and config.fp32_layers:
        kept = [layer for layer in select_layers(model, config.fp32_layers) if not is_kept_fp32(layer)]
        for layer in kept:
            keep_fp32(layer)
    lists, custom = _lists(dtype, level, config, custom_white_list, custom_black_list, use_promote)
    low, _ = classify_layers(model, lists.white, lists.black, lists.level, lists.promote)
    with _rehearsal_scope(dtype, lists, custom, previous, thread_wide=False) as held:
        held.hold(model.sublayers(include_self=True))  # a decorate(level="O2") made before
        try:
            with model_scope(model), _hooked(model, dtype):
                yield [name for name, _ in low]
        finally:
            for layer in kept:
                release_fp32(layer)


def _check_dtype(caller: str, dtype: Any) -> None:
    if dtype not in EMULATED_DTYPES:
        raise ValueError(f"{caller} dtype must be one of {EMULATED_DTYPES}. Received: dtype={dtype!r}")


def _lists(dtype: str, level: str, config: Optional[AmpConfig], white: Any, black: Any, promote: bool
           ) -> Tuple[_state.Lists, Tuple[Any, Any]]:
    """The rehearsal's lists, and the custom lists they came from."""
    if config is not None:
        level, white, black = config.level, config.custom_white_list, config.custom_black_list
    resolved = effective_op_lists(dtype, level, None, white, black)
    return _state.Lists(*resolved, level, bool(promote)), (tuple(white or ()), tuple(black or ()))


@contextlib.contextmanager
def _rehearsal_scope(dtype: str, lists: _state.Lists, custom: Tuple[Any, Any], previous: str,
                     thread_wide: bool) -> Iterator[HeldParameters]:
    """This thread rehearses ``dtype`` with ``lists``: the scaler runs, functional ops are
    rounded, and the layers a ``decorate(level="O2")`` marks hold low-precision parameters."""
    _compat.set_amp_state_dtype(dtype)  # what Paddle's own scaler checks in scale()
    token = _state.push_emulation(dtype, lists, custom, thread_wide)
    held = HeldParameters(dtype)
    listening = _state.listen_decorate(lambda layers: held.hold(layers, round_now=True))
    ops.acquire()
    try:
        yield held
    finally:
        ops.release()
        _state.unlisten_decorate(listening)
        held.release()
        _state.pop_emulation(token)
        _compat.set_amp_state_dtype(previous)


@contextlib.contextmanager
def _hooked(model: paddle.nn.Layer, dtype: str) -> Iterator[None]:
    """Hooks on the leaf layers whose op is reached only from C++ (``GroupNorm``, ``Bilinear``,
    ``Softmax``, ...), deciding at each call by the lists in force: a white-listed one takes
    rounded inputs and weights and gives a rounded output; one on the "follow the inputs" path
    gives a rounded output when its inputs and its own parameters hold low-precision values."""
    handles: List[Any] = []
    swap = WeightSwap(dtype)

    def decide(layer: Any) -> Optional[bool]:
        """True: low precision by the lists; False: follow the inputs; None: float32."""
        lists = _state.rehearsed_lists()
        if lists is None or not _compat.runs_eagerly():
            return None
        names = LAYER_OPS[type(layer).__name__]
        if any(op in lists.black for op in names):
            return None
        return ops.runs_low(names, lists)

    def pre_hook(layer: Any, inputs: Any) -> Any:
        if not decide(layer):
            return None
        swap.enter(layer)
        return lowprec.rounded(inputs, dtype)

    def post_hook(layer: Any, inputs: Any, output: Any) -> Any:
        swap.leave(layer)
        low = decide(layer)
        args = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
        if low is None or not (low or (lowprec.all_low(args, dtype) and all(_own_parameters(layer, dtype)))):
            return None
        return lowprec.rounded(output, dtype)

    for layer in model.sublayers(include_self=True):
        kind = type(layer).__name__
        if kind in LAYER_OPS and kind not in OP_LEVEL_LAYERS and not list(layer.children()) and not is_kept_fp32(layer):
            handles.append(layer.register_forward_pre_hook(pre_hook))
            handles.append(layer.register_forward_post_hook(post_hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        swap.leave_all()


def _own_parameters(layer: Any, dtype: str) -> Tuple[bool, ...]:
    """For each float32 parameter of ``layer``: whether it holds ``dtype`` values (a layer
    ``decorate(level="O2")`` marked for the dtype)."""
    held = (_state.o2_dtype(layer) or ("",))[0] == dtype
    return tuple(held for p in layer._parameters.values()  # noqa: SLF001
                 if p is not None and p.dtype == paddle.float32)


@contextlib.contextmanager
def rehearse(dtype: str = "float16", *, level: str = "O1", config: Optional[AmpConfig] = None,
             custom_white_list: Any = None, custom_black_list: Any = None, use_promote: bool = True
             ) -> Iterator[None]:
    """Rehearse ``dtype`` for every op of the thread while the block runs, with no model to name.

    The op-level part of :func:`fp16_emulation`, not confined to a model: ops called through
    Paddle's Python API (``paddle.matmul``, ``@``, ``paddle.einsum``, ``F.linear`` and so every
    ``nn.Linear``, the convolutions and so every ``Conv`` layer, ``F.embedding``, and the
    "follow the inputs" ops after them) are rounded, and the GradScaler runs its real
    machinery. Leaf layers whose op is reached only from C++ (``BatchNorm2D``, ``LayerNorm``)
    are rounded only by ``fp16_emulation(model)``. The script's own ``auto_cast`` lists and
    level, and its ``decorate(level="O2")``, are followed. ``python -m paddle_amp_ext.run
    --emulate`` uses this for a script.

    Args:
        dtype: ``"float16"`` or ``"bfloat16"``.
        level: as for :func:`paddle_amp_ext.auto_cast`.
        config: an :class:`paddle_amp_ext.AmpConfig` supplying level and the lists.
        custom_white_list: as for :func:`paddle_amp_ext.auto_cast`.
        custom_black_list: as for :func:`paddle_amp_ext.auto_cast`.
        use_promote: as for :func:`paddle_amp_ext.auto_cast`.

    Returns:
        A context manager; the rehearsal ends with the block (Paddle's global AMP dtype is
            restored exactly).

    Raises:
        ValueError: an unsupported dtype, or a bad op list.
    """
    _check_dtype("rehearse", dtype)
    previous = _compat.amp_state_dtype()
    lists, custom = _lists(dtype, level, config, custom_white_list, custom_black_list, use_promote)
    with _rehearsal_scope(dtype, lists, custom, previous, thread_wide=True):
        yield
