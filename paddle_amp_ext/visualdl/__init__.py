"""VisualDL hooks: loss and loss scale at every step, read back from the device in batches.

``VisualDLHook`` is a scaler hook: ``GradScaler(hooks=[VisualDLHook("runs/x")])``. Per training
step it logs, in one ``amp`` group that VisualDL shows expanded (loss first):

- ``amp/loss``: the unscaled loss;
- ``amp/loss_scale``: the scale used in that step (65536, 32768, ...), the number to compare;
- ``amp/log2_loss_scale``: its log2 (16 for 2**16: a readable staircase where the raw scale
  spans 1 to 1e11 on VisualDL's linear axis);
- ``amp/skipped_steps``: skipped steps so far (a staircase VisualDL's smoothing cannot turn into
  spikes, as it does a 0/1 flag);
- ``amp/grad_norm``: the unscaled gradient norm (when ``step(grad_clip=...)`` computed it, or
  with ``scaler.record_grad_norm = True``);
- ``amp/lr``: the learning rate.

The loss and grad norm stay on the device; a step costs a list append. Every step reaches the
operating system within ``flush_secs`` (default 1 s) by a background thread, whether or not
another step comes (host values first, then the device values, read in that thread), or after
``flush_every`` steps (one device read in the training thread), so a kill that runs no Python
(SIGKILL, an OOM kill, SIGABRT from a collective) loses at most the last ``flush_secs`` of
steps; exit, an exception, garbage collection, SIGTERM and SIGINT lose none (:mod:`.shutdown`,
docs/guides/records.md). Each hook writes its own run directory under ``logdir``, created
without following links, and nothing outside it: the records are written without importing
VisualDL (:mod:`.records`).

With several processes only rank 0 logs (``all_ranks=True``: every rank, in ``RUN/rankN``). The
skip count and grad norm it logs are global (the skip decision is agreed over the ranks, the
norm under fleet is the global one); ``amp/loss`` is the logging rank's own loss as passed to
``scale()``, not an average over the ranks (under pipeline parallel rank 0, the first stage, has
none).

``VisualDLCallback`` logs the same tags for ``paddle.Model.fit``. Serve the logs with
``python -m paddle_amp_ext.visualdl_serve --logdir runs`` (which adds ``--language en
--disable-telemetry``; docs/dashboards.md says why).
"""

from __future__ import annotations

from .callback import VisualDLCallback
from .hook import TAGS, VisualDLHook, run_directory_name
from .records import ScalarEncoder as _ScalarEncoder  # noqa: F401 - private names, importable here as before
from .records import repair_records
from .writer import BatchedWriter as _BatchedWriter  # noqa: F401

__all__ = ["TAGS", "VisualDLCallback", "VisualDLHook", "repair_records", "run_directory_name"]
