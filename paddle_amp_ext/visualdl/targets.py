"""Where a writer's encoded steps go, per ``report_to`` backend: a record file or a library's run.

- ``visualdl``: VisualDL's record file (:class:`.records.RecordFile`, :class:`.records.ScalarEncoder`);
- ``tensorboard``: TensorBoard's event file, the same :class:`.records.RecordFile` with
  :data:`paddle_amp_ext.dashboards.tensorboard.FORMAT`;
- ``wandb``: W&B's offline run file (:class:`WandbFile`, records from
  :mod:`paddle_amp_ext.dashboards.wandb_file`), written the same way; with ``WANDB_MODE=online``
  (or another mode but offline) W&B's own run;
- ``swanlab``: SwanLab's offline run file (:class:`SwanLabFile`, records from
  :mod:`paddle_amp_ext.dashboards.swanlab_file`), written the same way; with ``SWANLAB_MODE=online``
  (or another mode but offline) SwanLab's own run;
- a library's own run (W&B's, SwanLab's): in the run directory, created here without following
  links (the library writes below it), the steps handed on as values
  (:mod:`paddle_amp_ext.dashboards.library`).

Each library is imported only when its backend is opened. Whether it is installed was asked
before (:func:`paddle_amp_ext.dashboards.backends.require`, by the hook, before any directory).
"""

from __future__ import annotations

import os
from typing import Any, List, Tuple

from ..dashboards import swanlab_file, wandb_file
from ..dashboards import tensorboard as tb
from ..dashboards._wire import FileFormat
from ..dashboards.library import StepValues
from .records import _FILE_FLAGS, RecordFile, ScalarEncoder, open_run_dir

#: the entries a backend leaves in a run directory: a directory holding one is taken
MARKERS = ("vdlrecords.", tb.PREFIX, "wandb", "run-")


class SequencedRunFile(RecordFile):
    """A library's offline run file written as a record file: one ``write`` per flush of steps
    that ``self._sequence`` numbers and frames (committed once written, so a failed write changes
    nothing); ``close()`` in the process that opened it appends the run's end
    (:meth:`_end_records`) unless the file was removed. A subclass sets ``_sequence``.
    """

    #: each step is written once, whole (the library keeps one value per key and step)
    whole_steps = True
    _sequence: Any

    def __init__(self, base: str, parts: List[str], layout: FileFormat) -> None:
        self._pid = os.getpid()
        super().__init__(base, parts, "", layout)

    def write(self, chunks: List[Any]) -> None:
        data, state = self._sequence.encode(chunks, self._good)
        if data:
            self.write_bytes(data)
        self._sequence.commit(state)

    def _end_records(self) -> bytes:
        """The run's end records, framed from ``self._good``."""
        raise NotImplementedError

    def close(self) -> None:
        if self._fd >= 0 and os.getpid() == self._pid and not self.removed():
            try:
                self.write_bytes(self._end_records())
            except OSError:
                pass  # a run without its end is synced as failed (W&B) or crashed (SwanLab): nothing worse
        super().close()


class WandbFile(SequencedRunFile):
    """W&B's offline run file (``RUN/wandb/offline-run-*/run-<id>.wandb``, an empty ``files/`` beside
    it), created and written as a record file: one ``write`` per flush, cut back to its last whole
    record after a failed write, re-created (same run) when removed. The records are numbered and
    framed at the write (:class:`~paddle_amp_ext.dashboards.wandb_file.Sequence`), so a failed
    write changes nothing. ``close()`` in the process that opened it appends the run's end (its exit record).
    """

    def __init__(self, base: str, parts: List[str], info: wandb_file.RunInfo) -> None:
        self.info = info
        self._sequence = wandb_file.Sequence(info)
        layout = FileFormat("run-", lambda suffix: info.file_name, lambda ms: wandb_file.header(info))
        super().__init__(base, list(parts) + ["wandb", info.dir_name], layout)

    def _open_new(self) -> None:
        super()._open_new()
        os.close(open_run_dir(self._base, self._parts + ["files"]))  # where `wandb sync` writes what it uploads

    def _end_records(self) -> bytes:
        return self._sequence.exit_records(self._good)  # without it, W&B syncs the run as failed


class SwanLabFile(SequencedRunFile):
    """SwanLab's offline run file (``RUN/run-<time>-<id>/run-<id>.swanlab``, ``files/config.yaml``
    and ``files/swanlab-metadata.json`` beside it), created and written as a record file: one
    ``write`` per flush, cut back to its last whole record after a failed write, re-created (same
    run, each key's column again) when removed. The records are numbered and framed at the write
    (:class:`~paddle_amp_ext.dashboards.swanlab_file.Sequence`), so a failed write changes
    nothing. ``close()`` in the process that opened it appends the run's end (its finish record).
    """

    def __init__(self, base: str, parts: List[str], info: swanlab_file.RunInfo) -> None:
        self.info = info
        self._sequence = swanlab_file.Sequence()
        layout = FileFormat("run-", lambda suffix: info.file_name, self._header)
        super().__init__(base, list(parts) + [info.dir_name], layout)

    def _files_dir(self) -> str:
        return os.path.abspath(os.path.join(self._base, *self._parts, "files"))

    def _header(self, now_ms: int) -> bytes:
        self._sequence.restart()
        return swanlab_file.header(self.info, self._files_dir(), now_ms)

    def _open_new(self) -> None:
        super()._open_new()
        dir_fd = open_run_dir(self._base, self._parts + ["files"])  # what `swanlab sync` uploads with the run
        try:
            for name, data in (("config.yaml", swanlab_file.CONFIG_YAML),
                               ("swanlab-metadata.json", swanlab_file.METADATA_JSON)):
                try:
                    fd = os.open(name, _FILE_FLAGS, 0o644, dir_fd=dir_fd)
                except FileExistsError:
                    continue
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
        finally:
            os.close(dir_fd)

    def _end_records(self) -> bytes:
        return self._sequence.end_records(self._good, self._files_dir())  # without it, SwanLab syncs the run as crashed


def open_target(name: str, base: str, parts: List[str], suffix: str) -> Tuple[Any, Any]:
    """Backend ``name``'s target in ``base/parts...`` and the encoder of its steps.

    Args:
        name: a :data:`paddle_amp_ext.dashboards.backends.NAMES` name.
        base: the deepest existing directory of the logdir.
        parts: the directories below it (created without following links).
        suffix: appended to a record file's name (not W&B's or SwanLab's: their names are the library's).

    Returns:
        (target with ``write``/``removed``/``reopen``/``close``/``path``, encoder with ``step``).

    Raises:
        ImportError: the backend's library cannot be imported.
        OSError: the run directory cannot be created, or is a link.
    """
    if name == "visualdl":
        return RecordFile(base, parts, suffix), ScalarEncoder()
    if name == "tensorboard":
        return RecordFile(base, parts, suffix, tb.FORMAT), tb.EventEncoder()
    run_name = parts[-1] if parts else os.path.basename(base)
    if name == "wandb" and wandb_file.wants_own_file():
        info = wandb_file.RunInfo(run_name)
        return WandbFile(base, parts, info), wandb_file.HistoryEncoder(info)
    if name == "swanlab" and swanlab_file.wants_own_file():
        return SwanLabFile(base, parts, swanlab_file.RunInfo(run_name)), swanlab_file.ScalarEncoder()
    os.close(open_run_dir(base, parts))
    directory = os.path.join(base, *parts)
    if name == "swanlab":
        from ..dashboards.swanlab_run import SwanLabRun

        return SwanLabRun(directory, run_name), StepValues()
    from ..dashboards.wandb_run import WandbRun

    return WandbRun(directory, run_name), StepValues()


def has_records(path: str) -> bool:
    """True when ``path`` holds any backend's records (see :data:`MARKERS`)."""
    try:
        return any(entry.startswith(MARKERS) for entry in os.listdir(path))
    except OSError:
        return False
