"""VisualDL hooks: loss and loss scale at every step, read back from the device in batches.

``VisualDLHook`` is a scaler hook: ``GradScaler(hooks=[VisualDLHook("runs/x")])``. Per training
step it logs the AMP metrics (the loss, the loss scale and its log2, the skipped steps, the grad
norm, the learning rate) in one ``amp`` group that VisualDL shows expanded, loss first: their
names, meanings and units are the registry's, :data:`paddle_amp_ext.dashboards.metrics.METRICS`.
``report_to=`` writes them to TensorBoard, SwanLab or W&B too (:mod:`paddle_amp_ext.dashboards`).

The loss and grad norm stay on the device; a step costs a list append. Every step reaches the
operating system within ``flush_secs`` (default 1 s) by a background thread, whether or not
another step comes (host values first, then the device values, read in that thread), or after
``flush_every`` steps (one device read in the training thread), so a kill that runs no Python
(SIGKILL, an OOM kill, SIGABRT from a collective) loses at most the last ``flush_secs`` of
steps; exit, an exception, garbage collection, SIGTERM and SIGINT lose none (:mod:`.shutdown`;
the documentation's "What reaches the records"). Each hook writes its own run directory under ``logdir``, created
without following links, and nothing outside it: the records are written without importing
VisualDL (:mod:`.records`).

With several processes only rank 0 logs (``all_ranks=True``: every rank, in ``RUN/rankN``). The
skip count and grad norm it logs are global (the skip decision is agreed over the ranks, the
norm under fleet is the global one); ``amp/loss`` is the logging rank's own loss as passed to
``scale()``, not an average over the ranks (under pipeline parallel rank 0, the first stage, has
none).

``VisualDLHook.watch_fp8`` adds the FP8 statistics of an ``fp8_linears`` block to every step;
:func:`write_fp8_stats` writes a finished run's. ``VisualDLCallback`` logs the same tags for
``paddle.Model.fit``. Serve the logs with
``python -m paddle_amp_ext.visualdl_serve --logdir runs`` (which adds ``--language en
--disable-telemetry``; the Dashboards page says why).
"""

from __future__ import annotations

from .callback import VisualDLCallback
from .fp8 import write_fp8_stats
from .hook import TAGS, VisualDLHook, run_directory_name
from .records import ScalarEncoder as _ScalarEncoder  # noqa: F401 - private names, importable here as before
from .records import repair_records
from .writer import BatchedWriter as _BatchedWriter  # noqa: F401

__all__ = ["TAGS", "VisualDLCallback", "VisualDLHook", "repair_records", "run_directory_name", "write_fp8_stats"]
