"""SwanLab's offline run file, written here without importing SwanLab (the way its core writes it).

An offline run is ``RUN/run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.swanlab`` with ``files/config.yaml``
and ``files/swanlab-metadata.json`` beside it: SwanLab's record log. Its format (read in swanlab
0.10.3: ``sdk/internal/core_python/store`` writes and reads it, ``core_python/pkg/builder`` and
``core.py`` make the records, ``swanlab sync`` reads it with the same ``DataStoreReader``):

- a 7-byte header, ``:SWL``, the magic 0xE1D6 (little-endian) and the store version 2;
- LevelDB log blocks of 32 KiB (:mod:`._leveldb`, as W&B's);
- each record a serialized ``swanlab.record.v1.Record`` (its ``num``, its ``timestamp`` and one
  of): the ``start`` record (num -1: project, name, color, id, start time), the ``save`` of the
  metadata file (-4), per key at its first value a ``column`` (custom scalar, its section the
  key's part before its first ``/``), and per value a ``scalar`` (key, step, the log's time, the
  value as a double, NaN and inf kept), numbered 1, 2, ... in that order; at ``close()`` the
  ``save`` of the config file (-3) and the ``finish`` record (-2).

The bytes of a record are those SwanLab's protobuf classes serialize for the same message (the
tests compare them, and a file with a real ``swanlab.init(mode="offline")`` run's); SwanLab's
reader reads the file. This module only encodes:
:class:`paddle_amp_ext.visualdl.targets.SwanLabFile` writes.
"""

from __future__ import annotations

import colorsys
import math
import numbers
import os
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple
from zlib import crc32

from .._log import warn_once
from ._leveldb import _FULL_SEED, _PACK_CHUNK, BLOCK, frame
from ._offline_run import OfflineRun, new_run_id  # noqa: F401 - new_run_id: re-exported
from ._wire import int_field as _int
from ._wire import length_field as _len
from ._wire import string_field as _string
from ._wire import varint

#: ``:SWL``, the magic 0xE1D6 little-endian, the store version 2 (what swanlab 0.10.3 reads)
MAGIC = b":SWL" + struct.pack("<HB", 0xE1D6, 2)
#: SwanLab refuses a step above this (``core_python/metrics._MAX_STEP``)
MAX_STEP = 1 << 48
#: what SwanLab 0.10.3 writes into ``files/`` with every probe off (as the hook's library run had)
CONFIG_YAML = b"{}\n"
METADATA_JSON = b'{"_version":2,"hardware":null,"runtime":null,"git":null,"swanlab":null}'
_PACK_DOUBLE = struct.Struct("<d").pack
_ZERO = _PACK_DOUBLE(0.0)
_START, _FINISH, _CONFIG, _METADATA = -1, -2, -3, -4
_SCALAR_TYPE = b"\x18\x01"  # ScalarRecord.type: COLUMN_TYPE_SCALAR


def timestamp(ms: int) -> bytes:
    """A ``google.protobuf.Timestamp`` body for the wall time ``ms`` (milliseconds)."""
    ms = int(ms)
    return _int(1, ms // 1000) + _int(2, ms % 1000 * 1_000_000)


def new_color() -> str:
    """A run color as SwanLab picks one (``generate_color("beauty")``): a light, soft random hue."""
    r, g, b = colorsys.hsv_to_rgb(random.random(), random.uniform(0.4, 0.6), random.uniform(0.85, 1.0))
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


@dataclass(frozen=True)
class RunInfo(OfflineRun):
    """What the start record holds, fixed when the run opens: ``run-<local start time>-<id>/run-<id>.swanlab``."""

    EXTENSION = ".swanlab"

    color: str = field(default_factory=new_color)


def _record(num: int, now: bytes, kind: int, body: bytes) -> bytes:
    return b"\x08" + varint(num) + _len(2, now) + _len(kind, body)


def _save(num: int, now: bytes, name: str, path: str, kind: int) -> bytes:
    return _record(num, now, 20, _string(1, name) + _string(2, path) + _int(5, kind))


def header(info: RunInfo, files_dir: str, now_ms: int) -> bytes:
    """The start of a new file: the magic, the start record and the metadata file's save record, framed.

    Args:
        info: the run.
        files_dir: the absolute path of the run's ``files/`` (SwanLab's save records name it).
        now_ms: the wall time of the records.
    """
    now = timestamp(now_ms)
    start = (_string(1, info.project) + _string(4, info.name) + _string(9, info.color) + _string(10, info.run_id)
             + _len(12, timestamp(info.start_ms)))
    out = MAGIC + frame(_record(_START, now, 10, start), len(MAGIC))
    metadata = _save(_METADATA, now, "metadata", os.path.join(files_dir, "swanlab-metadata.json"), 2)
    return out + frame(metadata, len(out))


class ScalarStep:
    """One step checked: its number, its wall time and its values as floats (encoded, numbered and
    framed at write time, by :class:`Sequence`)."""

    __slots__ = ("step", "walltime_ms", "values")

    def __init__(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> None:
        self.step, self.walltime_ms, self.values = step, walltime_ms, values


class ScalarEncoder:
    """A step's values as the doubles SwanLab stores; :class:`Sequence` writes each as SwanLab's
    ``log()`` records it (a ``ScalarRecord``: key, step, type scalar, the step's wall time, the value).

    Raises (from ``step``) TypeError for a value that is no real number, as the other encoders do.
    """

    def step(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> ScalarStep:
        return ScalarStep(step, walltime_ms, [(key, value if value.__class__ is float else _as_float(value))
                                              for key, value in values])


def _as_float(value: object) -> float:
    """``value`` as the double SwanLab stores (``float(value)``; an int past float64's range: +-inf).

    Raises:
        TypeError: ``value`` is not a real number.
    """
    if not isinstance(value, numbers.Real):
        raise TypeError(f"A recorded value must be a real number. Received: {value!r} "
                        f"(of type {type(value).__name__})")
    try:
        return float(value)
    except OverflowError:  # an int past float64's range
        return math.inf if value > 0 else -math.inf


def column(key: str) -> bytes:
    """The column record's body SwanLab's core makes at a key's first value (``build_auto_column``
    with the default ``section_rule`` 0): custom, scalar, public, its section the key's first part."""
    section = key.split("/", 1)[0] if "/" in key else ""
    return b"\x08\x01\x10\x01" + _string(3, key) + _string(5, section) + b"\x30\x03"


class Sequence:
    """The records' numbers, the keys with a column and each key's last step: what a write commits once it succeeded.

    SwanLab's core keeps a key's value at a step not logged before for that key, from 0 up to
    2**48; here a step must also be above the key's last one (the hook's steps rise): an earlier
    step, a repeated one, a negative or a too large one is left out, warned once.
    """

    def __init__(self) -> None:
        self.num = 0
        self.columns: set = set()
        self.last: Dict[str, int] = {}
        self._keys: Dict[str, bytes] = {}  # each key's field, computed once

    def restart(self) -> None:
        """A new file (the old one was removed): its records numbered from 1 again, each key's column written again."""
        self.num, self.columns = 0, set()

    def encode(self, steps: List[ScalarStep], offset: int, now_ms: Optional[int] = None) -> Tuple[bytes, tuple]:
        """``steps`` as framed records from file ``offset``; returns the bytes and the state to
        :meth:`commit` once they are written."""
        now = b"\x12" + varint(len(stamp := timestamp(int(time.time() * 1000) if now_ms is None else now_ms))) + stamp
        num, columns, last = self.num, set(), dict(self.last)
        known, keys, out = self.columns, self._keys, []
        pack, zero = _PACK_DOUBLE, _ZERO
        for entry in steps:
            step = entry.step
            tail = (_int(2, step) if step > 0 else b"") + _SCALAR_TYPE + _len(4, timestamp(entry.walltime_ms))
            for key, value in entry.values:
                before = last.get(key, -1)
                if step <= before or step > MAX_STEP:
                    warn_once(f"swanlab:step:{id(self)}", "SwanLab: step %d of %r is not above its last step (%d) or "
                              "not in [0, 2**48]: not in the SwanLab run (VisualDL and TensorBoard have it).",
                              step, key, before)
                    continue
                last[key] = step
                if key not in known and key not in columns:
                    columns.add(key)
                    num += 1
                    part = frame(b"\x08" + varint(num) + now + _len(12, column(key)), offset)
                    out.append(part)
                    offset += len(part)
                num += 1
                field = keys.get(key) or self._key(key)
                raw = pack(value)  # the Record: num, timestamp, scalar (13): key, step, type, timestamp, value
                number, head = varint(num), len(field) + len(tail)
                if raw != zero:
                    record = b"\x08%b%b\x6a%b%b%b\x2a\x09\x09%b" % (number, now, varint(head + 11), field, tail, raw)
                else:  # proto3 leaves out a zero double: an empty value message
                    record = b"\x08%b%b\x6a%b%b%b\x2a\x00" % (number, now, varint(head + 2), field, tail)
                size = len(record)
                if offset % BLOCK + 7 + size <= BLOCK:  # the usual case, framed inline: one full chunk
                    out.append(_PACK_CHUNK(crc32(record, _FULL_SEED), size, 1) + record)
                    offset += 7 + size
                else:
                    part = frame(record, offset)
                    out.append(part)
                    offset += len(part)
        return b"".join(out), (num, columns, last)

    def _key(self, key: str) -> bytes:
        encoded = self._keys[key] = _string(1, key)
        return encoded

    def commit(self, state: tuple) -> None:
        self.num, columns, self.last = state
        self.columns |= columns

    def end_records(self, offset: int, files_dir: str, now_ms: Optional[int] = None) -> bytes:
        """The run's end, as SwanLab's ``finish()`` writes it: the config file's save record and the
        finish record (state finished). SwanLab syncs a run without one as crashed."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        now = timestamp(now_ms)
        out = frame(_save(_CONFIG, now, "config", os.path.join(files_dir, "config.yaml"), 1), offset)
        return out + frame(_record(_FINISH, now, 11, b"\x08\x01" + _len(3, now)), offset + len(out))


def wants_own_file(environ: Optional[dict] = None) -> bool:
    """True unless the user chose a SwanLab mode other than offline (``SWANLAB_MODE=online``,
    ``local``, ``disabled``): then SwanLab's own library runs, in that mode, at its own cost."""
    mode = (os.environ if environ is None else environ).get("SWANLAB_MODE", "").strip().lower()
    return mode in ("", "offline")
