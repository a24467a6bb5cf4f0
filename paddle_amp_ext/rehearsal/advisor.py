"""The AMP advisor: measure a model in float32 and in rehearsal, propose the config that makes it safe.

:func:`advise` runs one batch in float32 and under :func:`fp16_emulation`, records every leaf
layer's and functional op's values (forward and, with ``loss_fn``, backward), and measures per
place: the overflow margin (the dtype's largest value over max |x|), the fraction of non-zero
values the dtype flushes to zero, and the error of the rehearsed values against float32. From the
gradient range it proposes an initial loss scale. It proposes ``fp32_layers`` for the layers (or
the innermost layer around an op) whose values do not fit, and ``bfloat16`` where float16 cannot
be made safe that way; it then rehearses the model again with the proposal and checks that the
result is clean. A batch already inf/nan in float32 (a place, the output or the loss) gets no
proposal: the advice says the model produces NaN/inf without AMP and is never clean. Paddle's
``amp.debugging.compare_accuracy`` needs two GPU runs and an Excel sheet; this needs a CPU.

Example:
    >>> advice = advise(model, x, loss_fn=lambda out: out.mean())  # doctest: +SKIP
    >>> print(advice)                  # a table, then the proposal
    >>> cfg = advice.to_config()       # an AmpConfig; cfg.to_toml() for amp.toml
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import paddle

from ..config import AmpConfig
from ..gradients import grad_pairs
from .doctor import LIMITS, _check_model, _Recorder, measure
from .emulation import fp16_emulation

#: The smallest positive value each dtype holds (below half of it a value rounds to zero).
SMALLEST = {"float16": 2.0**-24, "bfloat16": 2.0**-133}


@dataclass(frozen=True)
class Place:
    """One recorded place: a leaf layer's value or a functional op's, forward or backward."""

    layer: str
    op: Optional[str]
    direction: str
    max_abs: float
    flushed: float  # fraction of non-zero values below the dtype's smallest value
    error: Optional[float]  # max relative error of the rehearsed value against float32

    @property
    def where(self) -> str:
        return f"{self.op} in {self.layer}" if self.op else self.layer


@dataclass(frozen=True)
class Advice:
    """What :func:`advise` measured and proposes; ``print`` it, or ``to_config()``.

    Attributes:
        dtype: the precision rehearsed (``"float16"`` or ``"bfloat16"``).
        limit: that precision's largest finite value.
        places: every recorded place (a leaf layer's or functional op's value, each direction).
        fp32_layers: the layers proposed to keep in float32.
        init_loss_scaling: the proposed first loss scale.
        grad_range: the (smallest non-zero, largest) gradient magnitude in float32.
        clean: the rehearsal with the proposal had no inf/nan and nothing beyond the range.
        notes: what else the advisor noticed, one sentence each.
        float32_nonfinite: where the batch is already inf/nan in float32 (then there is no proposal).
    """

    dtype: str
    limit: float
    places: Tuple[Place, ...]
    fp32_layers: Tuple[str, ...]
    init_loss_scaling: float
    grad_range: Tuple[float, float]
    clean: bool
    notes: Tuple[str, ...] = field(default=())
    float32_nonfinite: Optional[str] = None

    def to_config(self, base: Optional[AmpConfig] = None) -> AmpConfig:
        """The proposal as an :class:`AmpConfig` (on top of ``base``).

        Args:
            base: the config whose other settings the proposal keeps; default ``AmpConfig()``.

        Returns:
            ``base`` with the proposed ``dtype``, ``fp32_layers`` and ``init_loss_scaling``
                (``to_toml()`` of it is what ``doctor --advise`` writes).

        Raises:
            ValueError: the batch is not finite in float32, so there is no proposal.
        """
        if self.float32_nonfinite is not None:
            raise ValueError(f"No AMP config to propose: the model produces NaN/inf without AMP "
                             f"({self.float32_nonfinite}). Fix the model or the batch, then advise again.")
        base = base or AmpConfig()
        scaling = dict(init_loss_scaling=self.init_loss_scaling) if self.dtype == "float16" else {}
        return base.replace(dtype=self.dtype, fp32_layers=tuple(self.fp32_layers), **scaling)

    def __str__(self) -> str:
        rows = sorted(self.places, key=lambda p: (p.max_abs / self.limit) if math.isfinite(p.max_abs) else math.inf,
                      reverse=True)[:12]
        lines = [f"AMP advisor ({self.dtype}): the {len(rows)} places closest to {self.dtype}'s range "
                 f"(of {len(self.places)} recorded)",
                 f"{'where':40} {'pass':8} {'max |x|':>10} {'margin':>8} {'flushed':>8} {'error':>9}"]
        for p in rows:
            margin = "inf/nan" if not math.isfinite(p.max_abs) else (
                f"{self.limit / p.max_abs:.3g}" if p.max_abs else "-")
            error = "-" if p.error is None else f"{p.error:.2e}"
            lines.append(f"{p.where[:40]:40} {p.direction:8} {p.max_abs:10.3g} {margin:>8} {p.flushed:8.1%} {error:>9}")
        low, high = self.grad_range
        lines.append("")
        lines.append(f"Gradients in float32: |g| from {low:.3g} to {high:.3g}")
        lines += [f"Note: {note}" for note in self.notes]
        if self.float32_nonfinite is not None:
            lines.append(f"No proposal: the model produces NaN/inf without AMP ({self.float32_nonfinite}); "
                         "no AMP setting can make this batch finite.")
            return "\n".join(lines)
        lines.append(f"Proposal: dtype={self.dtype!r}, fp32_layers={list(self.fp32_layers)}"
                     + (f", init_loss_scaling={self.init_loss_scaling:g}" if self.dtype == "float16" else "")
                     + f" -> rehearsal with it is {'clean' if self.clean else 'NOT clean'}.")
        return "\n".join(lines)


def _grad_range(model: Any) -> Tuple[float, float]:
    low, high = math.inf, 0.0
    for _, grad in grad_pairs(model.parameters()):  # trainable ones; main_grad where set
        g = np.abs(grad.numpy().astype(np.float64))
        nonzero = g[g > 0]
        if nonzero.size:
            low, high = min(low, float(nonzero.min())), max(high, float(nonzero.max()))
    return (0.0 if low == math.inf else low), high


def _loss_scale(high: float, limit: float) -> float:
    """The largest power of two that keeps the largest gradient at most half the range."""
    if not high or not math.isfinite(high):
        return 1.0
    return float(2.0 ** min(24, max(0, math.floor(math.log2(limit / (2 * high))))))


class _Capture:
    """Records the max |x|, flushed fraction and a copy of every place's value."""

    def __init__(self, dtype: str) -> None:
        self.tiny = SMALLEST[dtype]

    def run(self, model: Any, inputs: Tuple[Any, ...], loss_fn: Optional[Callable]) -> List[Tuple]:
        """The recorded places; ``self.ends``: where the output and the loss are not finite."""
        recorder = _Recorder(model, keep_values=True)
        self.ends: List[str] = []
        try:
            output = model(*inputs)
            self._check_end("the model's output", output)
            if loss_fn is not None:
                loss = loss_fn(output)
                self._check_end("the loss", loss)
                loss.backward()
            records, copies = list(recorder.records), list(recorder.values)
        finally:
            recorder.remove()
        out = []
        for (name, _, direction, _, op), value in zip(records, copies):
            array = value.numpy()
            size = np.abs(array)
            nonzero = size[size > 0]
            flushed = float((nonzero < self.tiny / 2).mean()) if nonzero.size else 0.0
            out.append((name, op, direction, float(size.max()) if size.size else 0.0, flushed, array))
        return out


    def _check_end(self, what: str, value: Any) -> None:
        first = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(first, paddle.Tensor) and first.is_floating_point() and first.size > 0:
            if not bool(paddle.isfinite(first.astype("float32")).all()):
                self.ends.append(what)


def _first_nonfinite(places: List[Tuple], ends: List[str]) -> Optional[str]:
    """Where a float32 run first held inf/nan: a place (forward before backward), else its
    output or loss; None when everything was finite."""
    for direction in ("forward", "backward"):
        for name, op, d, max_abs, _, _ in places:
            if d == direction and not math.isfinite(max_abs):
                where = f"{op} in {name}" if op else name
                return f"first at {where}, in the {direction} pass"
    return f"at {ends[0]}" if ends else None


def advise(model: paddle.nn.Layer, *inputs: Any, loss_fn: Optional[Callable] = None,
           dtype: str = "float16") -> Advice:
    """Measure ``model`` on ``inputs`` in float32 and in rehearsal; propose a safe AMP config.

    Args:
        model: the model (its gradients are cleared afterwards).
        inputs: one batch of positional inputs.
        loss_fn: ``loss_fn(output) -> loss``; with it gradients are measured and a loss scale
            proposed.
        dtype: ``"float16"`` or ``"bfloat16"``.

    Returns:
        :class:`Advice`; ``advice.to_config()`` is the proposal as an AmpConfig.

    Raises:
        TypeError: ``model`` is not a ``paddle.nn.Layer``.
        ValueError: an unknown dtype.
    """
    _check_model(model)
    if dtype not in LIMITS:
        raise ValueError(f"dtype must be one of {tuple(LIMITS)}. Received: dtype={dtype!r}")
    limit, capture = LIMITS[dtype], _Capture(dtype)
    try:
        float32 = capture.run(model, inputs, loss_fn)
        grads = _grad_range(model) if loss_fn is not None else (0.0, 0.0)
        _clear(model)
        broken = _first_nonfinite(float32, capture.ends)
        if broken is not None:  # nothing AMP does can certify this batch
            places = tuple(Place(n, op, d, m, f, None) for n, op, d, m, f, _ in float32)
            note = f"the model produces NaN/inf in float32, without AMP ({broken})."
            return Advice(dtype, limit, places, (), 1.0, grads, False, (note,), broken)
        with fp16_emulation(model, dtype=dtype):
            rehearsed = capture.run(model, inputs, loss_fn)
        _clear(model)
        places = _places(float32, rehearsed)
        backward = [p.max_abs for p in places if p.direction == "backward" and math.isfinite(p.max_abs)]
        scale = _loss_scale(max([grads[1], *backward]), limit) if loss_fn is not None else 2.0**16
        root = type(model).__name__
        layers, notes = _too_big(places, limit, root=root)
        proposal, clean = dtype, False
        whole = root in layers  # keeping the whole model is no AMP at all (and no fp32_layers name)
        if whole:
            layers.remove(root)
        if dtype == "float16" and whole:
            notes.append("the model's own computation does not fit float16: use bfloat16 (CC >= 8.0).")
            proposal, layers = "bfloat16", []
        for _ in range(3):  # check the proposal by rehearsing with it; widen it when needed
            config = AmpConfig(dtype=proposal, fp32_layers=tuple(layers))
            clean, more = _rehearse_clean(model, inputs, loss_fn, config, scale if proposal == "float16" else 1.0)
            if clean:
                break
            if more and proposal == "float16" and root not in more:
                layers = sorted(set(layers) | set(more))
                continue
            if proposal == "float16":
                notes.append("float16 cannot be made safe by keeping layers in float32: use bfloat16 (CC >= 8.0).")
                proposal, layers = "bfloat16", []
        return Advice(proposal, LIMITS[proposal], tuple(places), tuple(layers), scale, grads, clean, tuple(notes))
    finally:
        _clear(model)


def _clear(model: Any) -> None:
    for param in model.parameters():
        param.clear_gradient(False)


def _places(float32: list, rehearsed: list) -> List[Place]:
    out = []
    same = len(float32) == len(rehearsed)
    for i, (name, op, direction, max_abs, flushed, array) in enumerate(float32):
        error = None
        if same and rehearsed[i][:3] == (name, op, direction) and rehearsed[i][5].shape == array.shape:
            scale = float(np.abs(array).max()) or 1.0
            with np.errstate(invalid="ignore", over="ignore"):
                error = float(np.abs(rehearsed[i][5].astype(np.float64) - array).max() / scale)
        rflushed = rehearsed[i][4] if same else flushed
        out.append(Place(name, op, direction, max_abs, max(flushed, rflushed), error))
    return out


def _too_big(places: List[Place], limit: float, root: str) -> Tuple[List[str], List[str]]:
    """Layers to keep in float32: where a forward value does not fit the range in float32
    (``root``, the model's own label, stands for the whole model)."""
    layers, notes = [], []
    for p in places:
        if p.direction == "forward" and not (math.isfinite(p.max_abs) and p.max_abs <= limit) and p.layer:
            if p.layer not in layers:
                layers.append(p.layer)
                if p.layer != root:
                    notes.append(f"{p.where} reaches {p.max_abs:.3g} in float32, beyond {limit:g}: keep "
                                 f"{p.layer!r} in float32.")
    return layers, notes


def _rehearse_clean(model: Any, inputs: Tuple[Any, ...], loss_fn: Optional[Callable], config: AmpConfig,
                    scale: float) -> Tuple[bool, List[str]]:
    """Whether a rehearsal with ``config`` (and the loss scale) is free of inf/nan and overflow;
    the layers that still overflow in the forward pass otherwise."""
    with fp16_emulation(model, dtype=config.dtype, config=config):
        report = measure(model, inputs, loss_fn, scale, config.dtype, LIMITS[config.dtype])
    more = [f.layer for f in report.findings if f.direction == "forward" and f.layer]
    return not report.findings, more
