"""What the scaler reports: ``StepResult`` per optimizer step, ``StepEvent`` per iteration.

Which fields are device tensors: ``StepResult.grad_norm`` and ``StepEvent.loss`` stay on the
device (reading them, e.g. ``float(result.grad_norm)``, is a device-to-host sync). ``skipped``,
``loss_scale`` and ``lr`` are host values the scaler already has: reading them costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    from paddle import Tensor


@dataclass(frozen=True)
class StepResult:
    """The outcome of ``GradScaler.step``.

    Attributes:
        skipped: True when inf/nan was found and the optimizer did not step (host bool).
        loss_scale: the scale the gradients of this step were multiplied by (host float;
            1.0 when loss scaling is off).
        grad_norm: the unscaled global gradient norm before clipping, a 1-element device
            tensor; None when no clipping was asked for or the step was skipped. While loss
            scaling is off the non-finite guard computes it anyway, and it is set then (inf/nan
            on a skipped step): always so for ``guard_optimizer``. Under fleet
            (sharding, tensor, pipeline parallel, stage 2/3) it is the norm of the reduced
            gradient over every rank's share, as fleet's clip computes it: the same on every rank.
    """

    skipped: bool
    loss_scale: float
    grad_norm: Optional[Tensor] = None

    @property
    def stepped(self) -> bool:
        """Whether the optimizer stepped (``not skipped``)."""
        return not self.skipped


@dataclass(frozen=True)
class StepEvent:
    """One training iteration, as the scaler's ``update()`` closes it.

    Attributes:
        step: 0-based iteration number (counts ``update()`` calls).
        loss: the unscaled loss passed to ``scale()`` (summed over accumulated micro-batches),
            a device tensor, or None when ``scale()`` was not called. An auto-parallel
            (DistTensor) loss is this rank's local value: the global loss where it is
            ``Replicate`` (tensor parallel), the rank's own loss where it is ``Partial``
            (data parallel: as under fleet, rank 0's ``amp/loss`` is rank 0's own loss).
        result: the StepResult of the last ``step()`` in this iteration.
        lr: the learning rate of the last optimizer given to ``step()`` (on a skipped step too:
            the rate it holds), a host value; None before the first ``step()``.
        next_loss_scale: the scale the next iteration will use.
    """

    step: int
    loss: Optional[Tensor]
    result: StepResult
    lr: Optional[float]
    next_loss_scale: float


@runtime_checkable
class ScalerHook(Protocol):
    """Anything with ``on_step(event)``; ``on_overflow(event)`` and ``close()`` are optional."""

    def on_step(self, event: StepEvent) -> Any: ...


def call_optional(hook: Any, method: str, *args: Any) -> None:
    func = getattr(hook, method, None)
    if func is not None:
        func(*args)
