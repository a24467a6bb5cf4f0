"""Where a writer's encoded steps go, per ``report_to`` backend: a record file or a library's run.

- ``visualdl``: VisualDL's record file (:class:`.records.RecordFile`, :class:`.records.ScalarEncoder`);
- ``tensorboard``: TensorBoard's event file, the same :class:`.records.RecordFile` with
  :data:`paddle_amp_ext.dashboards.tensorboard.FORMAT`;
- ``swanlab``, ``wandb``: the library's offline run in the run directory, created here without
  following links (the library writes below it), the steps handed on as JSON lines
  (:mod:`paddle_amp_ext.dashboards.library`).

Each library is imported only when its backend is opened.
"""

from __future__ import annotations

import os
from typing import Any, List, Tuple

from ..dashboards import backends
from ..dashboards import tensorboard as tb
from ..dashboards.library import JsonStepEncoder
from .records import RecordFile, ScalarEncoder, open_run_dir

#: the entries a backend leaves in a run directory: a directory holding one is taken
MARKERS = ("vdlrecords.", tb.PREFIX, "wandb", "run-")


def open_target(name: str, base: str, parts: List[str], suffix: str) -> Tuple[Any, Any]:
    """Backend ``name``'s target in ``base/parts...`` and the encoder of its steps.

    Args:
        name: a :data:`paddle_amp_ext.dashboards.backends.NAMES` name.
        base: the deepest existing directory of the logdir.
        parts: the directories below it (created without following links).
        suffix: appended to a record file's name.

    Returns:
        (target with ``write_bytes``/``removed``/``reopen``/``close``/``path``, encoder with ``step``).

    Raises:
        ImportError: the backend's library is not installed (naming the extra).
        OSError: the run directory cannot be created, or is a link.
    """
    backends.require(name)
    if name == "visualdl":
        return RecordFile(base, parts, suffix), ScalarEncoder()
    if name == "tensorboard":
        return RecordFile(base, parts, suffix, tb.FORMAT), tb.EventEncoder()
    os.close(open_run_dir(base, parts))
    directory = os.path.join(base, *parts)
    run_name = parts[-1] if parts else os.path.basename(base)
    if name == "swanlab":
        from ..dashboards.swanlab_run import SwanLabRun

        return SwanLabRun(directory, run_name), JsonStepEncoder()
    from ..dashboards.wandb_run import WandbRun

    return WandbRun(directory, run_name), JsonStepEncoder()


def has_records(path: str) -> bool:
    """True when ``path`` holds any backend's records (see :data:`MARKERS`)."""
    try:
        return any(entry.startswith(MARKERS) for entry in os.listdir(path))
    except OSError:
        return False
