"""The dashboards the AMP metrics go to: the metric registry and the ``report_to`` backends.

:mod:`.metrics` is the one list of metrics (name, meaning, unit, when written; the FP8
family's tags from :func:`.metrics.fp8_tag`); :mod:`.backends`
the dashboards (``"visualdl"``, ``"tensorboard"``, ``"swanlab"``, ``"wandb"``). Each library is
imported only by its own writer (:mod:`.tensorboard` and :mod:`.wandb_file`, W&B's offline run,
need none; :mod:`.swanlab_run`, and :mod:`.wandb_run` for ``WANDB_MODE=online``). The Dashboards
page of the documentation says what holds per backend.
"""

from __future__ import annotations

from .backends import BACKENDS, Backend, parse_report_to
from .metrics import FP8_METRICS, METRICS, NAMES, Metric, fp8_tag, metric

__all__ = ["BACKENDS", "Backend", "FP8_METRICS", "METRICS", "Metric", "NAMES", "fp8_tag", "metric", "parse_report_to"]
