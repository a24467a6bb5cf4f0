"""The AMP metrics: the one registry every writer, hook, callback, docs table and test names them from.

A metric is a name (``amp/loss_scale``: VisualDL and TensorBoard group by the part before the
``/``, SwanLab and W&B show it as a section), what it is, its unit, when it is written and the
key it takes in a Trainer's own ``logs`` (``loss_scale``; None when the Trainer logs it itself).
Adding a metric is one :class:`Metric` in :data:`METRICS` plus the code that gives its value.

This module imports nothing but the standard library (the docs build reads it without Paddle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Metric:
    """One AMP metric as the dashboards show it.

    Args:
        name: the tag, ``amp/<key>``.
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


def markdown_table() -> str:
    """The registry as a Markdown table (name, meaning, unit, when written, Trainer ``logs`` key), for the docs."""
    lines = ["| metric | what it is | unit | written | Trainer `logs` key |", "|---|---|---|---|---|"]
    for m in METRICS:
        key = f"`{m.trainer_key}`" if m.trainer_key else "-"
        lines.append(f"| `{m.name}` | {m.meaning} | {m.unit} | {m.when} | {key} |")
    return "\n".join(lines)
