"""``python -m paddle_amp_ext.check --verify``: prove the package on the user's own GPU.

- :mod:`.comparisons`: op dtypes against the lists, the unscale kernel against its emulation, the
  rehearsal against the GPU (numpy only).
- :mod:`.verdict`: whether AMP pays, and why not (numbers only).
- :mod:`.report`: the frozen report, its text and JSON.
- :mod:`.models`: the small CNN and Transformer block, ``--model module:factory``.
- :mod:`.gpu_checks`: the device calls (:class:`DeviceRunner`, the seam tests replace).
- :mod:`.pipeline`: the checks in order; :mod:`.command`: GPU discovery and the entry point.
"""

from __future__ import annotations

from .command import verify
from .models import ModelError
from .report import CheckResult, VerifyReport
from .verdict import Measurement, ModelFacts, Verdict, judge

__all__ = ["CheckResult", "Measurement", "ModelError", "ModelFacts", "Verdict", "VerifyReport", "judge", "verify"]
