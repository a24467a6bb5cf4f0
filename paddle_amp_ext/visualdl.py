"""VisualDL hooks: loss and loss scale at every step, read back from the device in batches.

``VisualDLHook`` is a scaler hook: ``GradScaler(hooks=[VisualDLHook("runs/x")])``. Per training
step it logs, in one ``amp`` group that VisualDL shows expanded (loss first):

- ``amp/loss``: the unscaled loss;
- ``amp/log2_loss_scale``: log2 of the scale used in that step (16 for 2**16: a readable
  staircase where the raw scale spans 1 to 1e11 on VisualDL's linear axis);
- ``amp/skipped_steps``: skipped steps so far (a staircase VisualDL's smoothing cannot turn into
  spikes, as it does a 0/1 flag);
- ``amp/grad_norm``: the unscaled gradient norm (when ``step(grad_clip=...)`` computed it, or
  with ``scaler.record_grad_norm = True``);
- ``amp/lr``: the learning rate.

The loss and grad norm stay on the device; every ``flush_every`` steps (and at close) they are
fetched in one transfer and written as one VisualDL record, so a non-flush step costs a list
append. Each hook writes its own run directory under ``logdir``.

``VisualDLCallback`` logs the same five tags for ``paddle.Model.fit``.

With several processes only rank 0 logs (``all_ranks=True``: every rank, in ``RUN/rankN``). The
skip count and grad norm it logs are global (the skip decision is agreed over the ranks, the
norm under fleet is the global one); ``amp/loss`` is the logging rank's own loss as passed to
``scale()``, not an average over the ranks (under pipeline parallel rank 0, the first stage, has
none).

VisualDL is imported here only, when a hook is created. Serve the logs with
``python -m paddle_amp_ext.visualdl_serve --logdir runs`` (which adds ``--language en
--disable-telemetry``; see the README for why).
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import struct
import sys
import tempfile
import time
import weakref
from typing import Any, List, Optional, Tuple

import paddle

from . import _compat
from ._log import logger, warn_once
from .events import StepEvent
from .scaler import GradScaler

TAGS = ("amp/loss", "amp/log2_loss_scale", "amp/skipped_steps", "amp/grad_norm", "amp/lr")


def _visualdl() -> Tuple[Any, Any]:
    """VisualDL's Record message and meta_data helper.

    VisualDL creates ``~/.visualdl/conf`` when it is imported and fails where ``$HOME`` is not
    writable (a read-only container, a service account): then it is imported once more with
    ``HOME`` pointing at a private temporary directory, which only that config file uses.
    """
    try:
        return _import_visualdl()
    except ImportError as exc:
        raise ImportError("VisualDL hooks need VisualDL: pip install 'paddle-amp-ext[visualdl]'") from exc
    except OSError as exc:
        for name in [m for m in sys.modules if m == "visualdl" or m.startswith("visualdl.")]:
            del sys.modules[name]
        home = os.environ.get("HOME")
        os.environ["HOME"] = tempfile.mkdtemp(prefix="paddle-amp-ext-visualdl-home-")
        logger.info("VisualDL could not write its config under $HOME (%s); using %s for it.", exc,
                    os.environ["HOME"])
        try:
            return _import_visualdl()
        finally:
            if home is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = home


def _import_visualdl() -> Tuple[Any, Any]:
    from visualdl.component.base_component import meta_data
    from visualdl.proto.record_pb2 import Record

    return Record, meta_data


def _rank() -> Tuple[int, int]:
    try:
        return paddle.distributed.get_rank(), paddle.distributed.get_world_size()
    except Exception:
        return 0, 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class _ScalarEncoder:
    """Serialized VisualDL scalar records, byte-identical to ``Record(values=[Value(...)])``.

    ``Record.values`` is field 1; ``Value`` has ``id`` (1, varint), ``tag`` (2, bytes),
    ``timestamp`` (3, varint) and ``value`` (4, float32). The tag prefix and the per-step varints
    are computed once, which makes a value ~5x cheaper than building the protobuf message.
    """

    def __init__(self) -> None:
        self._tags: dict = {}

    def _tag(self, tag: str) -> bytes:
        prefix = self._tags.get(tag)
        if prefix is None:
            raw = tag.encode("utf-8")
            prefix = self._tags[tag] = b"\x12" + _varint(len(raw)) + raw
        return prefix

    def step(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> bytes:
        head = b"\x08" + _varint(step) if step else b""  # proto3 leaves out zero scalars
        tail = (b"\x18" + _varint(walltime_ms) if walltime_ms else b"") + b"%"
        out = []
        for tag, value in values:
            body = head + self._tag(tag) + tail + struct.pack("<f", value)
            record = b"\n" + _varint(len(body)) + body
            out.append(struct.pack("<Q", len(record)) + record)
        return b"".join(out)


class _RecordFile:
    """A VisualDL record file: each record is a little-endian uint64 length and a ``Record``.

    VisualDL's own ``LogWriter`` queues every scalar to a thread that opens and closes the file
    per record (~72 us a scalar); here a whole batch is one unbuffered ``write``, so what was
    written survives ``kill -9``. A batch is written whole or not at all: after a failed write
    (a full disk, a file-size limit) the file is cut back to its last whole record, because
    VisualDL's reader rejects a file that ends in a partial one, earlier steps included.
    """

    def __init__(self, logdir: str, suffix: str, meta_data: Any) -> None:
        os.makedirs(logdir, exist_ok=True)
        stamp = f"vdlrecords.{int(time.time()):010d}.log"
        path = os.path.join(logdir, stamp + suffix)
        if os.path.exists(path):  # two writers in one second and directory: keep them apart
            path = os.path.join(logdir, f"{stamp}{suffix}.{os.getpid()}.{id(self)}")
        self.path = path
        self._file = open(path, "ab", buffering=0)
        self._good = self._file.tell()
        meta = meta_data(walltime=round(time.time() * 1000)).SerializeToString()
        self.write_bytes(struct.pack("<Q", len(meta)) + meta)

    def write_bytes(self, data: bytes) -> None:
        """Append ``data`` whole, or raise OSError with the file as it was before."""
        view = memoryview(data)
        try:
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError("the write made no progress")
                view = view[written:]
        except OSError:
            try:
                os.ftruncate(self._file.fileno(), self._good)
            except OSError as cut:  # pragma: no cover - a file that cannot even be cut back
                logger.warning("VisualDL hook could not cut %s back to its last whole record: %r", self.path, cut)
            raise
        self._good += len(data)

    def close(self) -> None:
        self._file.close()


class _BatchedWriter:
    """Buffers (tag, device-or-host value) rows per step; one device read and one write per flush."""

    def __init__(self, logdir: str, flush_every: int, filename_suffix: str) -> None:
        if not isinstance(flush_every, int) or flush_every < 1:
            raise ValueError(f"flush_every must be an int >= 1. Received: flush_every={flush_every!r}")
        _, meta_data = _visualdl()
        self.logdir = logdir
        self.flush_every = flush_every
        try:
            self._file = _RecordFile(logdir, filename_suffix, meta_data)
        except OSError as exc:
            raise OSError(exc.errno, f"VisualDL hook cannot write to logdir {logdir!r}: {exc.strerror or exc}. "
                          "Pass a writable directory.") from exc
        self._encoder = _ScalarEncoder()
        self._rows: List[Tuple[str, Any]] = []  # (tag, host float or device tensor)
        self._steps_meta: List[Tuple[int, int, int]] = []  # (step, walltime ms, number of rows)
        self._steps = 0
        self._backlog: List[bytes] = []  # encoded steps a failed write left, oldest first
        self.dropped = 0  # steps given up on (backlog over its bound, or unwritten at close)
        self.closed = False
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def path(self) -> str:
        return self._file.path

    def add(self, step: int, walltime_ms: int, values: List[Tuple[str, Any]]) -> None:
        self._rows.extend(values)
        self._steps_meta.append((step, walltime_ms, len(values)))
        self._steps += 1
        if self._steps >= self.flush_every:
            self.flush()

    #: encoded steps kept for a retry after a failed write (about 150 bytes a step): 10,000 steps
    MAX_BACKLOG = 10_000

    def flush(self) -> None:
        """Fetch buffered device values in one transfer and write them in one batch.

        A write error (full disk, file-size limit) never reaches the training loop: it is logged
        once, the encoded steps are kept (at most :attr:`MAX_BACKLOG`, oldest dropped first) and
        written at the next flush; what could not be written is reported at close.
        """
        if self.closed:
            return
        if self._rows:
            self._backlog.extend(self._encode())
        if not self._backlog:
            return
        if len(self._backlog) > self.MAX_BACKLOG:
            excess = len(self._backlog) - self.MAX_BACKLOG
            self.dropped += excess
            del self._backlog[:excess]
        try:
            self._file.write_bytes(b"".join(self._backlog))
        except OSError as exc:
            warn_once(f"visualdl:write:{self.path}", "VisualDL hook could not write to %s (%s): training goes on; "
                      "up to %d steps are kept and written once the disk has room.", self.path, exc, self.MAX_BACKLOG)
            return
        self._backlog = []

    def _encode(self) -> List[bytes]:
        """The buffered steps as encoded records, one bytes object a step (one device read)."""
        groups: dict = {}  # one stack (and one host read) per (shape, dtype), usually one in all
        for i, (_, value) in enumerate(self._rows):
            if isinstance(value, paddle.Tensor):
                groups.setdefault((tuple(value.shape), value.dtype), []).append(i)
        fetched = {}
        for indices in groups.values():
            host = paddle.stack([self._rows[i][1] for i in indices]).numpy().reshape(len(indices), -1)[:, 0]
            fetched.update(zip(indices, host.tolist()))
        chunks, i = [], 0
        for step, wall, count in self._steps_meta:
            values = [(tag, fetched.get(j, value)) for j, (tag, value) in enumerate(self._rows[i:i + count], i)]
            chunks.append(self._encoder.step(step, wall, values))
            i += count
        self._rows, self._steps_meta, self._steps = [], [], 0
        return chunks

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        self._file.close()
        self.closed = True
        self.dropped += len(self._backlog)
        self._backlog = []
        if self.dropped:
            logger.warning("VisualDL hook: %d steps could not be written to %s (the disk was full or the file "
                           "size limited); every record in the file is whole.", self.dropped, self.path)


def _close_at_exit(ref: weakref.ref[_BatchedWriter]) -> None:
    writer = ref()
    if writer is not None and not writer.closed:
        try:
            writer.close()
        except Exception as exc:  # interpreter shutdown: report, never raise
            logger.warning("VisualDL hook could not flush at exit: %r", exc)


def _checked_logdir(logdir: Any) -> str:
    """``logdir`` as a path, or a TypeError/ValueError naming it."""
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a directory path such as 'runs/exp1'. Received: logdir={logdir!r} "
                        f"(of type {type(logdir).__name__})")
    path = os.fspath(logdir)
    if not str(path).strip():
        raise ValueError("logdir must be a directory path such as 'runs/exp1'. Received: logdir='' (empty)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"logdir {path!r} is a file, not a directory: pass a directory path.")
    return str(path)


_run_counter = itertools.count()


def run_directory_name() -> str:
    """A new run's directory name: local time, then pid and a counter, so runs sort by time and
    two hooks started in the same second (in one process or two) never share a directory."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_run_counter)}"


def _log_dir(logdir: Any, all_ranks: bool, run_name: Optional[str] = None) -> Optional[str]:
    """Where this rank writes: ``logdir/RUN`` (``logdir/RUN/rankN`` with ``all_ranks``), or None."""
    logdir = _checked_logdir(logdir)
    rank, world = _rank()
    if run_name is None:
        run_name = run_directory_name()
        if world > 1 and all_ranks:  # every rank writes into rank 0's run (one collective, at creation)
            names = [run_name]
            paddle.distributed.broadcast_object_list(names, src=0)
            run_name = names[0]
    elif not isinstance(run_name, str) or os.sep in run_name or run_name in (".", ".."):
        raise ValueError(f"run_name must be a directory name (no {os.sep!r}), '' for logdir itself, or None for a "
                         f"new timestamped run. Received: run_name={run_name!r}")
    target = os.path.join(logdir, run_name) if run_name else logdir
    if world > 1 and all_ranks:
        return os.path.join(target, f"rank{rank}")
    return target if rank == 0 else None


class VisualDLHook:
    """Log loss, loss scale, skips, grad norm and lr to VisualDL at every step.

    Args:
        logdir: the VisualDL log directory to serve (``visualdl_serve --logdir LOGDIR``).
        flush_every: fetch device values and write every N steps (and at close/exit).
        all_ranks: in data-parallel runs log every rank to ``RUN/rank{N}`` (every rank must create
            the hook: rank 0 tells the others the run's name); default rank 0 only.
        filename_suffix: appended to the record file's name.
        run_name: the run's directory under ``logdir``. Default: a new one named by local time,
            pid and a counter (``20261130-060707-4242-0``), so every hook and every re-run is its
            own run in VisualDL's run list (VisualDL shows only the newest record file of a
            directory); ``""`` writes into ``logdir`` itself. ``hook.logdir`` says where.

    Example:
        >>> with VisualDLHook("runs/exp1") as hook:  # doctest: +SKIP
        ...     scaler = paddle_amp_ext.GradScaler(hooks=[hook])
        ...     train(scaler)
    """

    def __init__(self, logdir: str = "runs", *, flush_every: int = 50, all_ranks: bool = False,
                 filename_suffix: str = "", run_name: Optional[str] = None) -> None:
        target = _log_dir(logdir, all_ranks, run_name)
        self._out = _BatchedWriter(target, flush_every, filename_suffix) if target else None
        self.logdir = target
        self._closed = False
        self._skipped = 0
        if target:
            logger.info("VisualDLHook: logging to %s (serve with: python -m paddle_amp_ext.visualdl_serve --logdir %s)",
                        target, logdir)

    @property
    def active(self) -> bool:
        """False on ranks that do not log."""
        return self._out is not None and not self._out.closed

    def on_step(self, event: StepEvent) -> None:
        if self._closed:
            warn_once(f"visualdl:closed:{id(self)}", "VisualDLHook(%r).on_step after close(): step %d and later "
                      "steps are not logged. Remove the hook from the scaler or create a new one.",
                      self.logdir, event.step)
            return
        if not self.active:
            return
        result = event.result
        self._skipped += bool(result is not None and result.skipped)
        values: List[Tuple[str, Any]] = []
        if event.loss is not None:
            values.append(("amp/loss", event.loss))
        values.append(("amp/log2_loss_scale", math.log2(result.loss_scale) if result else 0.0))
        values.append(("amp/skipped_steps", float(self._skipped)))
        if result is not None and result.grad_norm is not None:
            values.append(("amp/grad_norm", result.grad_norm))
        if event.lr is not None:
            values.append(("amp/lr", event.lr))
        self._out.add(event.step, int(time.time() * 1000), values)

    def flush(self) -> None:
        if self._out is not None:
            self._out.flush()

    def close(self) -> None:
        self._closed = True
        if self._out is not None:
            self._out.close()

    @property
    def dropped_steps(self) -> int:
        """Steps that could not be written (full disk or file-size limit), 0 normally."""
        return self._out.dropped if self._out is not None else 0

    def __enter__(self) -> VisualDLHook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class VisualDLCallback(paddle.callbacks.Callback):
    """hapi callback: the same five tags for ``paddle.Model.fit(..., amp_configs=...)``.

    The loss comes from hapi's logs (already on the host); the loss scale and the skip count of
    hapi's own GradScaler stay on the device until a flush. To train hapi with this package's
    scaler (the guard, collapse detection, ``amp/grad_norm`` from the second batch on), run
    ``fit`` inside :func:`paddle_amp_ext.routed`: hapi builds its scaler as
    ``paddle.amp.GradScaler(**amp_configs)``.

    Example:
        >>> model.fit(data, epochs=1, callbacks=[VisualDLCallback("runs/hapi")])  # doctest: +SKIP
    """

    def __init__(self, logdir: str = "runs", *, flush_every: int = 50, all_ranks: bool = False,
                 run_name: Optional[str] = None) -> None:
        super().__init__()
        target = _log_dir(logdir, all_ranks, run_name)
        self._out = _BatchedWriter(target, flush_every, "") if target else None
        self.logdir = target
        self._step = 0
        self._skips: Any = None  # skipped steps so far, for Paddle's own scaler (a device value)

    def on_train_batch_begin(self, step: int, logs: Optional[dict] = None) -> None:
        scaler = _compat.hapi_scaler(self.model)
        if isinstance(scaler, GradScaler):  # hapi builds it during the first batch
            scaler.record_grad_norm = True

    def on_train_batch_end(self, step: int, logs: Optional[dict] = None) -> None:
        if self._out is None:
            return
        logs = logs or {}
        values: List[Tuple[str, Any]] = []
        loss = logs.get("loss")
        if loss is not None:
            first = loss[0] if isinstance(loss, (list, tuple)) else loss
            values.append(("amp/loss", float(getattr(first, "item", lambda: first)())))
        scaler = _compat.hapi_scaler(self.model)
        if isinstance(scaler, GradScaler) and scaler.last_result is not None:
            result = scaler.last_result
            values.append(("amp/log2_loss_scale", math.log2(result.loss_scale)))
            values.append(("amp/skipped_steps", float(scaler.skipped_steps)))
            if result.grad_norm is not None:
                values.append(("amp/grad_norm", result.grad_norm))
        elif scaler is not None and scaler.is_enable():  # Paddle's own scaler: device values, no sync
            scale, found = _compat.paddle_scaler_view(scaler)
            if scale is not None:
                values.append(("amp/log2_loss_scale", paddle.log2(scale)))
            if found is not None:
                flag = found.astype("float32") if isinstance(found, paddle.Tensor) else float(bool(found))
                self._skips = flag if self._skips is None else self._skips + flag
                values.append(("amp/skipped_steps", self._skips))
        else:
            values.append(("amp/log2_loss_scale", 0.0))
            values.append(("amp/skipped_steps", 0.0))
        optimizer = getattr(self.model, "_optimizer", None)
        if optimizer is not None:
            values.append(("amp/lr", float(optimizer.get_lr())))
        self._out.add(self._step, int(time.time() * 1000), values)
        self._step += 1

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        if self._out is not None:
            self._out.close()
