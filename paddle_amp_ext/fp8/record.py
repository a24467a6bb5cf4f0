"""One quantization of one tensor: the record :class:`~paddle_amp_ext.fp8.stats.Fp8Stats` keeps and
:mod:`.reduction` folds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantRecord:
    """One quantization of one tensor.

    Attributes:
        layer: the layer's name in the model.
        role: ``"input"``, ``"weight"`` or ``"output_grad"``.
        step: the training step it belongs to.
        fmt: the FP8 format (``"e4m3fn"`` or ``"e5m2"``).
        saturated: the fraction of values clipped to +-max.
        flushed: the fraction of nonzero values rounded to zero.
        amax: the tensor's largest absolute value.
        scale_min: the smallest of its scales.
        scale_max: the largest of its scales.
    """

    layer: str
    role: str
    step: int
    fmt: str
    saturated: float
    flushed: float
    amax: float
    scale_min: float
    scale_max: float
