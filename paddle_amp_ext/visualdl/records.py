"""VisualDL's record file, written here without importing VisualDL.

A record file ``vdlrecords.<unix time>.log`` is a sequence of records, each a little-endian
uint64 length and a serialized ``visualdl.Record`` (VisualDL 2.5.3's ``record.proto``): first a
meta record, then one record per scalar. ``Record.values`` is field 1; ``Value`` has ``id`` (1,
varint), ``tag`` (2, bytes), ``timestamp`` (3, varint), ``value`` (4, float32) and
``meta_data`` (10, a message). The bytes written are those VisualDL's protobuf writes (the tests
compare them), so VisualDL's ``LogReader`` and dashboard read them.

VisualDL itself is not imported: its import creates ``~/.visualdl/conf``, which would be the one
file a hook writes outside its logdir (and fails where ``$HOME`` is not writable).
"""

from __future__ import annotations

import importlib.util
import os
import struct
import time
from typing import List, Tuple

from .._log import logger


def require_visualdl() -> None:
    """Raise ImportError naming the extra when VisualDL is not installed (it is located, not imported)."""
    try:
        found = importlib.util.find_spec("visualdl") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ImportError("VisualDL hooks need VisualDL: pip install 'paddle-amp-ext[visualdl]'")


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


def _framed(value: bytes) -> bytes:
    """``Record(values=[value])`` with its uint64 length in front."""
    record = b"\n" + _varint(len(value)) + value
    return struct.pack("<Q", len(record)) + record


def meta_record(walltime_ms: int) -> bytes:
    """The first record of a file, as VisualDL's ``meta_data(walltime=...)`` serializes it."""
    tag = b"meta_data_tag"
    stamp = b"\x18" + _varint(walltime_ms) if walltime_ms else b""
    return _framed(b"\x12" + _varint(len(tag)) + tag + stamp + b"R\x00")  # R = field 10: an empty MetaData


class ScalarEncoder:
    """Serialized scalar records, byte-identical to ``Record(values=[Value(...)])``.

    The tag prefix and the per-step varints are computed once, which makes a value ~5x cheaper
    than building the protobuf message.
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
        return b"".join(_framed(head + self._tag(tag) + tail + struct.pack("<f", value)) for tag, value in values)


class RecordFile:
    """A record file opened for appending, written in whole records.

    VisualDL's own ``LogWriter`` queues every scalar to a thread that opens and closes the file
    per record (~72 us a scalar); here a whole batch is one unbuffered ``write``, so what was
    written survives ``kill -9``. A batch is written whole or not at all: after a failed write
    (a full disk, a file-size limit) the file is cut back to its last whole record, because
    VisualDL's reader rejects a file that ends in a partial one, earlier steps included.
    """

    def __init__(self, logdir: str, suffix: str) -> None:
        os.makedirs(logdir, exist_ok=True)
        stamp = f"vdlrecords.{int(time.time()):010d}.log"
        path = os.path.join(logdir, stamp + suffix)
        if os.path.exists(path):  # two writers in one second and directory: keep them apart
            path = os.path.join(logdir, f"{stamp}{suffix}.{os.getpid()}.{id(self)}")
        self.path = path
        self._file = open(path, "ab", buffering=0)
        self._good = self._file.tell()
        self.write_bytes(meta_record(round(time.time() * 1000)))

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
