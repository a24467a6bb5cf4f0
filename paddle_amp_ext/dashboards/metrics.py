"""The AMP metrics: the one registry every writer, hook, callback, docs table and test names them from.

A metric is a name (``amp/loss_scale``: VisualDL and TensorBoard group by the part before the
``/``, SwanLab and W&B show it as a section), what it is, its unit, when it is written and the
key it takes in a Trainer's own ``logs`` (``loss_scale``; None when the Trainer logs it itself).
Adding a metric is one :class:`Metric` in :data:`METRICS` plus the code that gives its value.

The FP8 statistics are a templated family, :data:`FP8_METRICS`: one entry per quantity, named
``fp8/<layer>/<tensor>/<quantity>``; :func:`fp8_tag` gives (and checks) the tag of one layer
and tensor. They are not in :data:`METRICS` (a hook writes them only for an ``Fp8Stats`` it
watches).

This module imports nothing but the standard library (the docs build reads it without Paddle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Metric:
    """One AMP metric as the dashboards show it.

    Args:
        name: the tag, ``amp/<key>``; for the FP8 family its pattern, ``fp8/<layer>/<tensor>/<quantity>``.
        meaning: what the value is, one sentence.
        unit: its unit (``"steps"``, ``"1"`` for a plain number).
        when: when a step has it.
        trainer_key: the key in a Trainer's ``logs`` (``on_log``), or None when not added there.
    """

    name: str
    meaning: str
    unit: str
    when: str
    trainer_key: Optional[str] = None

    @property
    def key(self) -> str:
        """The name without its group: ``loss_scale`` for ``amp/loss_scale``."""
        return self.name.split("/", 1)[1]


LOSS = Metric("amp/loss", "the unscaled loss given to scale() (or to guard.record_loss()); a loss of N values is "
              "recorded as its mean; beyond float32's range: inf in VisualDL and TensorBoard", "loss",
              "every step that has a loss (not on a guard without record_loss)")
LOSS_SCALE = Metric("amp/loss_scale", "the raw loss scale of the step, the number to compare with 65536 or 32768",
                    "1", "every step (1.0 without loss scaling)", trainer_key="loss_scale")
LOG2_LOSS_SCALE = Metric("amp/log2_loss_scale", "log2 of the loss scale (16 for 2**16): a readable staircase where "
                         "the raw scale spans 1 to 1e11 on a linear axis", "log2", "every step")
SKIPPED_STEPS = Metric("amp/skipped_steps", "steps skipped so far (inf/nan gradients): a count, which smoothing "
                       "cannot turn into spikes as it does a 0/1 flag", "steps", "every step",
                       trainer_key="skipped_steps")
GRAD_NORM = Metric("amp/grad_norm", "the unscaled global gradient norm", "1",
                   "steps whose scaler computed it (step(grad_clip=...) or scaler.record_grad_norm = True)",
                   trainer_key="grad_norm")
LR = Metric("amp/lr", "the learning rate the optimizer holds", "1", "every step whose optimizer is known, skipped "
            "steps too")

#: Every metric, in the order the dashboards show them (loss first).
METRICS: Tuple[Metric, ...] = (LOSS, LOSS_SCALE, LOG2_LOSS_SCALE, SKIPPED_STEPS, GRAD_NORM, LR)

#: Every metric's name, in :data:`METRICS` order.
NAMES: Tuple[str, ...] = tuple(metric.name for metric in METRICS)

_BY_NAME: Dict[str, Metric] = {metric.name: metric for metric in METRICS}

#: The tensors an FP8 linear quantizes: its input, its weight and its output's gradient.
FP8_TENSORS: Tuple[str, ...] = ("input", "weight", "output_grad")

_FP8_WHEN = ("every step that quantized the tensor, for an Fp8Stats a hook watches (hook.watch_fp8); of several "
             "quantizations in the step:")
FP8_SATURATED = Metric("fp8/<layer>/<tensor>/saturated", "fraction of the tensor's values beyond the format's max "
                       "plus half a step (464 for e4m3fn, 61440 for e5m2) or infinite: clipped to +-max", "1",
                       _FP8_WHEN + " the largest")
FP8_FLUSHED = Metric("fp8/<layer>/<tensor>/flushed", "fraction of the nonzero values at most half the smallest "
                     "subnormal (`2**-10` for e4m3fn, `2**-17` for e5m2): rounded to zero", "1",
                     _FP8_WHEN + " the largest")
FP8_AMAX = Metric("fp8/<layer>/<tensor>/amax", "the largest absolute value before scaling (NaN ignored; NaN when every "
                  "value is NaN; inf when one is inf)", "1", _FP8_WHEN + " the largest")
FP8_SCALE_MIN = Metric("fp8/<layer>/<tensor>/scale_min", "the smallest finite scale of the tensor's blocks (one "
                       "scale for per-tensor recipes); NaN when none is finite", "1",
                       _FP8_WHEN + " the smallest")
FP8_SCALE_MAX = Metric("fp8/<layer>/<tensor>/scale_max", "the largest finite scale of the tensor's blocks; NaN when "
                       "none is finite", "1", _FP8_WHEN + " the largest")

#: The FP8 family, one entry per quantity, in the order :func:`fp8_tag` names them.
FP8_METRICS: Tuple[Metric, ...] = (FP8_SATURATED, FP8_FLUSHED, FP8_AMAX, FP8_SCALE_MIN, FP8_SCALE_MAX)

#: The FP8 quantities: ``saturated``, ``flushed``, ``amax``, ``scale_min``, ``scale_max``.
FP8_QUANTITIES: Tuple[str, ...] = tuple(m.name.rsplit("/", 1)[1] for m in FP8_METRICS)

#: The longest tag every backend takes (SwanLab's limit on a metric key).
MAX_TAG_LENGTH = 512


def fp8_tag(layer: str, tensor: str, quantity: str) -> str:
    """The dashboard tag of one FP8 quantity: ``fp8/<layer>/<tensor>/<quantity>``.

    The layer's name is kept as given (``mlp.gate``, ``blocks/0``, spaces and any Unicode): the
    last two parts of a tag are always the tensor and the quantity, so a ``/`` in a layer's
    name cannot make two tags alike.

    Args:
        layer: the FP8 linear's name in its model (as ``named_sublayers`` gives it).
        tensor: one of :data:`FP8_TENSORS`.
        quantity: one of :data:`FP8_QUANTITIES`.

    Returns:
        The tag, such as ``"fp8/mlp.gate/input/saturated"``.

    Raises:
        TypeError: an argument is not a string.
        ValueError: ``layer`` is empty or holds a control character (SwanLab refuses such a key),
            the tag would be longer than :data:`MAX_TAG_LENGTH` characters, or ``tensor`` or
            ``quantity`` is not one of the names above.

    Example:
        >>> fp8_tag("mlp.gate", "output_grad", "amax")
        'fp8/mlp.gate/output_grad/amax'
    """
    for name, value in (("layer", layer), ("tensor", tensor), ("quantity", quantity)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string. Received: {name}={value!r} (of type {type(value).__name__})")
    if tensor not in FP8_TENSORS:
        raise ValueError(f"tensor must be one of {list(FP8_TENSORS)}. Received: tensor={tensor!r}")
    if quantity not in FP8_QUANTITIES:
        raise ValueError(f"quantity must be one of {list(FP8_QUANTITIES)}. Received: quantity={quantity!r}")
    if not layer:
        raise ValueError("layer must be a layer's name such as 'mlp.gate'. Received: layer='' (empty)")
    if any(ord(c) < 32 or ord(c) == 127 for c in layer):
        raise ValueError(f"layer {layer!r} holds a control character, which SwanLab refuses in a tag: rename the "
                         "sublayer (add_sublayer(name, ...)) without it")
    tag = f"fp8/{layer}/{tensor}/{quantity}"
    if len(tag) > MAX_TAG_LENGTH:
        raise ValueError(f"the tag of layer {layer[:40]!r}... is {len(tag)} characters, more than the "
                         f"{MAX_TAG_LENGTH} SwanLab takes: give the sublayer a shorter name")
    return tag


def metric(name: str) -> Metric:
    """The registered metric called ``name``.

    Args:
        name: a metric name such as ``"amp/loss_scale"``.

    Returns:
        Its :class:`Metric`.

    Raises:
        KeyError: ``name`` is not registered (the message lists the names that are).

    Example:
        >>> metric("amp/loss_scale").unit
        '1'
    """
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise KeyError(f"{name!r} is not an AMP metric. Expected one of {list(NAMES)}.") from None


#: The families :func:`markdown_table` renders: ``"amp"``, ``"fp8"``.
FAMILIES: Dict[str, Tuple[Metric, ...]] = {"amp": METRICS, "fp8": FP8_METRICS}


def markdown_table(family: Optional[str] = None) -> str:
    """The registry as a Markdown table (name, meaning, unit, when written, Trainer ``logs`` key), for the docs.

    Args:
        family: ``"amp"`` or ``"fp8"`` for one family; None for both, AMP first.

    Raises:
        ValueError: ``family`` is not one of :data:`FAMILIES`.
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)} or None. Received: family={family!r}")
    rows = FAMILIES[family] if family is not None else METRICS + FP8_METRICS
    lines = ["| metric | what it is | unit | written | Trainer `logs` key |", "|---|---|---|---|---|"]
    for m in rows:
        key = f"`{m.trainer_key}`" if m.trainer_key else "-"
        lines.append(f"| `{m.name}` | {m.meaning} | {m.unit} | {m.when} | {key} |")
    return "\n".join(lines)
