"""The overflow doctor: which layer first produced inf/nan or a value beyond fp16's range.

Three ways in:

- :func:`find_overflow` (on demand): one forward (and backward, with ``loss_fn``) of the model
  with every leaf layer and functional op watched, and Paddle's own tensor checker
  (:mod:`.checker`) for the ops no hook sees (weight gradients, ops reached only from C++);
  returns an :class:`OverflowReport`.
- :class:`OverflowWatch` (when the scaler sees inf/nan): a scaler hook that keeps the layers
  watched (device-side max-abs per layer, no host sync) and names the culprit in the log when
  a step overflows.
- ``python -m paddle_amp_ext.doctor train.py [args]`` (:mod:`.script`,
  :mod:`paddle_amp_ext.cli.doctor`): runs a training script and stops at the first layer whose
  value would not fit, with the fix.

Works on float32 models on a CPU: a value above 65504 there is one fp16 could not hold.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import paddle

from .. import _compat, _state
from .._log import logger
from ..keep import is_kept_fp32
from . import checker, ops
from .emulation import LAYER_OPS

LIMITS = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}


@dataclass(frozen=True)
class Finding:
    """One value that was non-finite or beyond the dtype's range.

    ``op`` is set when a functional op produced it (``matmul_v2`` in attention), and ``layer``
    is then the innermost layer it ran in; otherwise ``layer`` is the leaf layer that produced it.
    ``layer`` is empty for an op only Paddle's tensor checker saw (``matmul_grad``: a weight
    gradient).

    Attributes:
        layer: the layer's qualified name in the model (``"0.self_attn"``), or empty.
        layer_type: the layer's class name (``"MultiHeadAttention"``).
        ops: the ops that may have produced the value (the layer's, or ``op``).
        direction: ``"forward"`` or ``"backward"``.
        max_abs: the largest magnitude seen (inf or nan allowed).
        op: the functional op that produced it, where known.
        in_float32: the value was already inf/nan in float32, with no AMP at all.
    """

    layer: str
    layer_type: str
    ops: Tuple[str, ...]
    direction: str
    max_abs: float
    op: Optional[str] = None
    in_float32: bool = False

    @classmethod
    def of(cls, name: str, layer: Any, direction: str, max_abs: float, op: Optional[str] = None,
           in_float32: bool = False) -> Finding:
        """A finding for ``layer`` (its type and ops looked up).

        Args:
            name: the layer's qualified name in the model (``"0.self_attn"``).
            layer: the layer object.
            direction: ``"forward"`` or ``"backward"``.
            max_abs: the largest magnitude seen (inf or nan allowed).
            op: the op that produced it, where known.
            in_float32: the value was measured in float32 (non-finite there: no AMP fix).

        Returns:
            The finding.
        """
        kind = type(layer).__name__
        ops = (op,) if op else LAYER_OPS.get(kind, ())
        return cls(name, kind, ops, direction, float(max_abs), op, in_float32 and not math.isfinite(max_abs))

    def fixes(self, dtype: str) -> List[str]:
        """What to change, in order: keep the layer in float32, black-list its op, use bfloat16.

        Args:
            dtype: the precision the finding is about (``"float16"`` or ``"bfloat16"``).

        Returns:
            Sentences naming the exact call, e.g. ``keep_fp32(model, ['0.self_attn'])``.
        """
        if self.in_float32:
            return ["no AMP setting can: check the batch (inf/nan inputs), the initialization and the learning rate",
                    "paddle.amp.debugging.enable_tensor_checker names the first op that produced it"]
        # a layer labelled by its class is the model itself: keeping all of it would be no AMP at all
        whole = self.layer == self.layer_type
        out = [f"keep the layer in float32: keep_fp32(model, [{self.layer!r}])"] if self.layer and not whole else []
        if self.ops:
            out.append(f"black-list its op: auto_cast(custom_black_list={list(self.ops[:1])!r})")
        if dtype == "float16":
            out.append("switch to dtype='bfloat16' (float32's range) on a GPU with CC >= 8.0")
        if self.direction == "backward":
            out.append("lower init_loss_scaling (e.g. 2**12): scaled gradients overflow first")
        return out


@dataclass(frozen=True)
class OverflowReport:
    """What the doctor found; ``culprit`` is the first finding in execution order.

    Attributes:
        dtype: the precision watched (``"float16"`` or ``"bfloat16"``).
        limit: that precision's largest finite value.
        findings: every value beyond ``limit`` or non-finite, in execution order.
    """

    dtype: str
    limit: float
    findings: Tuple[Finding, ...] = field(default=())

    @property
    def culprit(self) -> Optional[Finding]:
        """The first finding in execution order (None when every value fit)."""
        return self.findings[0] if self.findings else None

    def __bool__(self) -> bool:
        return bool(self.findings)

    def __str__(self) -> str:
        first = self.culprit
        if first is None:
            return f"Overflow doctor: every watched value fits {self.dtype} (|x| <= {self.limit:g})."
        value = "non-finite" if not math.isfinite(first.max_abs) else f"{first.max_abs:.4g}"
        ops = ", ".join(first.ops) or "unknown op"
        if first.op and not first.layer:
            where = f"op {first.op!r} (found by Paddle's tensor checker; no layer hook sees it)"
        elif first.op:
            where = f"op {first.op!r} in layer {first.layer!r} ({first.layer_type})"
        else:
            where = f"layer {first.layer!r} ({first.layer_type}: {ops})"
        if first.in_float32:
            lines = [f"Overflow doctor: the model produces NaN/inf without AMP: {where} produced a non-finite value "
                     f"in the {first.direction} pass in float32.",
                     "Fixes: " + "; ".join(first.fixes(self.dtype)) + "."]
            return "\n".join(lines)
        lines = [
            f"Overflow doctor: {where} produced max |value| {value} in the {first.direction} pass, "
            f"beyond {self.dtype}'s {self.limit:g}.",
            "Fixes: " + "; ".join(first.fixes(self.dtype)) + ".",
        ]
        return "\n".join(lines)


def peak_abs(value: paddle.Tensor) -> paddle.Tensor:
    """max |value| as a float32 scalar tensor, kept on the device; NaN when an element is NaN
    (Paddle 2.6.2's CPU ``max`` skips NaN: ``max([nan, 1]) == 1``)."""
    value = value.detach().astype("float32")
    return paddle.max(paddle.abs(value)) + paddle.sum(value * 0.0)  # 0, or NaN where a value is inf/nan


def _limit(dtype: Any, limit: Any = None) -> float:
    """The largest allowed |value| for ``dtype`` (or ``limit``); ValueError naming a bad one."""
    if dtype not in LIMITS:
        raise ValueError(f"dtype must be one of {tuple(LIMITS)}. Received: dtype={dtype!r}")
    if limit is None:
        return LIMITS[dtype]
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < float(limit) < math.inf:
        raise ValueError(f"limit must be a finite number > 0 (the largest allowed |value|). Received: limit={limit!r}")
    return float(limit)


def _check_model(model: Any) -> None:
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"Expected a paddle.nn.Layer model. Received: {model!r} (of type {type(model).__name__})")


class _Recorder:
    """Forward/backward max-abs of every leaf layer and every functional op (:mod:`.ops`), kept
    on the device until analysed; an op is named with the innermost layer it ran in."""

    def __init__(self, model: paddle.nn.Layer, on_record: Optional[Callable[..., None]] = None,
                 keep_values: bool = False):
        self.records: List[Tuple[str, Any, str, paddle.Tensor, Optional[str]]] = []
        self.plain: List[bool] = []  # each record is a float32 value of an unscaled run (no rehearsal)
        self.unscaled = True
        self.values: List[paddle.Tensor] = []  # a float32 copy of each recorded value, with keep_values
        self._keep_values = keep_values
        self._on_record = on_record
        self._handles: List[Any] = []
        self._stack: List[Tuple[str, Any]] = []  # the layers running now, outermost first
        self._thread = threading.get_ident()
        for name, layer in model.named_sublayers(include_self=True):
            label = name or type(layer).__name__
            self._handles.append(layer.register_forward_pre_hook(self._pre(label)))
            self._handles.append(layer.register_forward_post_hook(self._post(label, leaf=not list(layer.children()))))
        ops.acquire()
        self._observer = ops.observe(self._on_op)
        self._observer.__enter__()

    def _add(self, name: str, layer: Any, direction: str, value: paddle.Tensor, op: Optional[str] = None) -> None:
        stat = peak_abs(value)
        self.records.append((name, layer, direction, stat, op))
        self.plain.append(_state.emulated_dtype() is None and (direction == "forward" or self.unscaled))
        if self._keep_values:
            self.values.append(value.detach().astype("float32").clone())
        if self._on_record is not None:
            self._on_record(name, layer, direction, stat)

    def _in_fp32(self) -> bool:
        """Inside a ``keep_fp32`` layer: float32 values there need not fit the low-precision range."""
        return any(is_kept_fp32(layer) for _, layer in self._stack)

    def _pre(self, name: str) -> Callable:
        def hook(layer: Any, inputs: Any) -> None:
            self._stack.append((name, layer))
            if list(layer.children()) or self._in_fp32():
                return
            for item in inputs if isinstance(inputs, (list, tuple)) else (inputs,):
                if isinstance(item, paddle.Tensor) and item.is_floating_point() and not item.stop_gradient:
                    item.register_hook(lambda g, n=name, lay=layer: self._add(n, lay, "backward", g))
        return hook

    def _post(self, name: str, leaf: bool) -> Callable:
        def hook(layer: Any, inputs: Any, output: Any) -> None:
            kept = self._in_fp32()
            if self._stack and self._stack[-1][1] is layer:
                self._stack.pop()
            if not leaf or kept:
                return
            first = output[0] if isinstance(output, (list, tuple)) and output else output
            if isinstance(first, paddle.Tensor) and first.is_floating_point() and first.size > 0:
                self._add(name, layer, "forward", first)
        return hook

    def _on_op(self, op: str, out: Any) -> None:
        if threading.get_ident() != self._thread or not self._stack or not isinstance(out, paddle.Tensor):
            return
        if not out.is_floating_point() or out.size == 0 or self._in_fp32():
            return
        name, layer = self._stack[-1]
        self._add(name, layer, "forward", out, op)
        if not out.stop_gradient:
            out.register_hook(lambda g, n=name, lay=layer, o=op: self._add(n, lay, "backward", g, o))

    def analyse(self, dtype: str, limit: float) -> OverflowReport:
        """One host read of all recorded stats; forward findings first, then backward."""
        if not self.records:
            return OverflowReport(dtype, limit)
        values = paddle.stack([r[3].reshape([1]) for r in self.records]).numpy().reshape(-1)
        found = []
        for direction in ("forward", "backward"):
            for (name, layer, d, _, op), value, plain in zip(self.records, values, self.plain):
                if d == direction and not (np.isfinite(value) and value <= limit):
                    found.append(Finding.of(name, layer, d, value, op, in_float32=plain))
        found.sort(key=lambda f: not f.in_float32)  # a float32 NaN/inf is the first thing to fix
        return OverflowReport(dtype, limit, tuple(found))

    def clear(self) -> None:
        self.records, self.values, self.plain = [], [], []
        self._stack = []

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._observer is not None:
            self._observer.__exit__()
            self._observer = None
            ops.release()


def measure(model: paddle.nn.Layer, inputs: Tuple[Any, ...], loss_fn: Optional[Callable], loss_scale: float,
            dtype: str, limit: float) -> OverflowReport:
    """One watched forward (and backward, with ``loss_fn``); the report, unlogged. The model's
    gradients are cleared afterwards."""
    recorder = _Recorder(model)
    recorder.unscaled = loss_scale == 1.0
    try:
        output = model(*inputs)
        if loss_fn is not None:
            (loss_fn(output) * loss_scale).backward()
        return recorder.analyse(dtype, limit)
    finally:
        recorder.remove()
        if loss_fn is not None:
            for param in model.parameters():
                param.clear_gradient(False)


def find_overflow(model: paddle.nn.Layer, *inputs: Any, loss_fn: Optional[Callable] = None,
                  loss_scale: float = 1.0, dtype: str = "float16",
                  limit: Optional[float] = None) -> OverflowReport:
    """Run the model once and name the first layer whose value does not fit ``dtype``.

    Args:
        model: the model (float32 is fine: the doctor checks against ``dtype``'s range).
        inputs: positional inputs for ``model``.
        loss_fn: ``loss_fn(output) -> loss``; with it the backward pass is checked as well,
            and the model's gradients are cleared afterwards.
        loss_scale: multiply the loss by this before backward (what the scaler would do).
        dtype: ``"float16"`` (limit 65504) or ``"bfloat16"``.
        limit: override the largest allowed |value|.

    Returns:
        OverflowReport; ``report.culprit`` is None when everything fits.

    Example:
        >>> report = find_overflow(model, x, loss_fn=lambda out: out.mean())  # doctest: +SKIP
        >>> print(report)
    """
    limit = _limit(dtype, limit)
    _check_model(model)
    # Paddle's checker tests against float16's range and knows no layers: used for a float32
    # model with nothing kept in float32, outside a rehearsal (rounded values would be its own)
    checked = (dtype == "float16" and limit == LIMITS["float16"] and _state.emulated_dtype() is None
               and not any(is_kept_fp32(layer) for layer in model.sublayers(include_self=True)))
    with checker.paddle_checker() if checked else contextlib.nullcontext([]) as seen:
        report = measure(model, inputs, loss_fn, loss_scale, dtype, limit)
    report = _with_checked_ops(report, seen)
    if report:
        logger.warning("%s", report)
    return report


def _with_checked_ops(report: OverflowReport, checked: List[Tuple[str, float]]) -> OverflowReport:
    """``report`` plus what Paddle's checker found that AMP runs in float16 and the doctor's own
    watch did not name."""
    named = {(op, f.direction) for f in report.findings for op in f.ops}
    white = _compat.default_op_lists(report.dtype, "O1")[0]
    extra = tuple(Finding("", "", (base,), direction, peak, op)
                  for op, base, direction, peak in checker.unnamed(checked, white, named, report.limit))
    return OverflowReport(report.dtype, report.limit, report.findings + extra) if extra else report


class OverflowWatch:
    """Scaler hook: when a step overflows, log which layer did it.

    Costs one max-abs reduction per leaf layer per pass, all on the device; the host reads them
    only after an overflow. Use ``scaler.add_hook(OverflowWatch(model))``.

    Args:
        model: the model whose leaf layers are watched.
        dtype: the precision whose range counts (``"float16"`` or ``"bfloat16"``).

    Raises:
        TypeError: ``model`` is not a ``paddle.nn.Layer``.
        ValueError: an unsupported dtype.
    """

    def __init__(self, model: paddle.nn.Layer, dtype: str = "float16") -> None:
        self.limit = _limit(dtype)
        _check_model(model)
        self.dtype = dtype
        self.last_report: Optional[OverflowReport] = None
        self._recorder = _Recorder(model)

    def on_overflow(self, event: Any) -> None:
        """Analyse the recorded values and log the layer that overflowed (the host reads them now).

        Args:
            event: the scaler's :class:`paddle_amp_ext.StepEvent` for the skipped step.
        """
        report = self._recorder.analyse(self.dtype, self.limit)
        self.last_report = report
        logger.warning("step %d overflowed. %s", event.step, report)

    def on_step(self, event: Any) -> None:
        """Forget the step's recorded values (no host read).

        Args:
            event: the scaler's :class:`paddle_amp_ext.StepEvent`.
        """
        self._recorder.clear()

    def close(self) -> None:
        """Remove the watch's layer hooks from the model."""
        self._recorder.remove()
