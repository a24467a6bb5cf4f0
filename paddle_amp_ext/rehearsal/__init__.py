"""fp16/bf16 rehearsal on any device and the overflow doctor.

- :mod:`.rounding`: exact fp16/bf16 rounding of float32 tensors on both Paddle versions.
- :mod:`.emulation`: :func:`fp16_emulation`, the rehearsal context.
- :mod:`.doctor`: :func:`find_overflow`, :class:`OverflowWatch` and their reports.
- :mod:`.ops`: op-level rehearsal by Paddle's AMP rules, wherever an op is called
  (``paddle.matmul``, ``@``, ``F.conv2d``, the "follow the inputs" ops after them).
- :mod:`.composite`: functions Paddle runs as several ops (a conv and its bias add; 2.6's F.linear).
- :mod:`.scope`: where ``fp16_emulation(model)`` rounds (the model's forwards).
- :mod:`.pure`: parameters held in low precision (white-listed layers, ``decorate(level="O2")``).
- :mod:`.lowprec`: which tensors hold low-precision values (marks by weak reference).
- :mod:`.checker`: Paddle's own tensor checker around a doctor pass, read back as findings.
- :mod:`.advisor`: :func:`advise`, the config that makes a model's rehearsal clean.
- :mod:`.script`: the doctor's script runner (``python -m paddle_amp_ext.doctor``).
"""

from __future__ import annotations

from .advisor import Advice, advise
from .doctor import LIMITS, Finding, OverflowReport, OverflowWatch, find_overflow
from .emulation import LAYER_OPS, fp16_emulation, quantize, rehearse

__all__ = ["LAYER_OPS", "LIMITS", "Advice", "Finding", "OverflowReport", "OverflowWatch", "advise", "find_overflow",
           "fp16_emulation", "quantize", "rehearse"]
