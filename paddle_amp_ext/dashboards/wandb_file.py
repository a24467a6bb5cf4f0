"""W&B's offline run file, written here without importing W&B (the way ``wandb-core`` writes it).

An offline run is ``RUN/wandb/offline-run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb`` (beside an
empty ``files/``, where ``wandb sync`` puts the summary and config it uploads): W&B's
transaction log. Its format (``core/pkg/leveldb/record.go`` and
``core/internal/transactionlog/`` in W&B's repository, read for wandb 0.31.0):

- a 7-byte header, ``:W&B``, the magic 0xBEE1 (little-endian) and the store version 0;
- LevelDB log blocks of 32 KiB: each record is one or more chunks, a chunk being its CRC-32 (the
  IEEE one, over the chunk type and the data), its length (uint16), its type (1 full, 2 first,
  3 middle, 4 last) and the data; a chunk header never straddles a block (fewer than 7 bytes left:
  zeros), a record may;
- each record a serialized ``wandb_internal_pb2.Record``: here the ``header`` (version info), the
  ``run`` (id, project, name, host, start time), one ``history`` per step (the values with
  ``_timestamp``, ``_runtime`` and ``_step``, as W&B's own ``log()`` makes it), one ``summary``
  per flush (the latest value of each key), and at ``close()`` a ``summary`` of the run's time and
  the ``exit``.

The bytes of a record are those W&B's protobuf classes serialize for the same message (the tests
compare them); W&B's reader (``wandb leet inspect``, the one ``wandb sync`` uses) reads the file.
This module only encodes: :class:`paddle_amp_ext.visualdl.targets.WandbFile` writes.
"""

from __future__ import annotations

import numbers
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .._log import warn_once
from ._leveldb import BLOCK, frame  # noqa: F401 - BLOCK: re-exported (the tests frame across blocks)
from ._offline_run import OfflineRun, new_run_id  # noqa: F401 - new_run_id: re-exported
from ._wire import int_field as _int
from ._wire import length_field as _message
from ._wire import string_field as _string
from ._wire import varint

#: ``:W&B``, the magic 0xBEE1 little-endian, the store version 0
MAGIC = b":W&B\xe1\xbe\x00"
_INT64_MAX = (1 << 63) - 1
#: the version info of the header record (what wandb 0.31.0's wandb-core writes as min_consumer)
MIN_CONSUMER = "0.70.0"
_varint = varint  # the name this module had


def _bytes_field(key: bytes, value: bytes) -> bytes:
    return key + varint(len(value)) + value


def json_number(value: object) -> str:
    """``value`` as W&B's ``value_json``: JSON with ``NaN``, ``Infinity``, ``-Infinity`` kept.

    Raises:
        TypeError: ``value`` is not a real number.
    """
    if value.__class__ is not float:
        if not isinstance(value, numbers.Real):
            raise TypeError(f"A recorded value must be a real number. Received: {value!r} "
                            f"(of type {type(value).__name__})")
        try:
            value = float(value)
        except OverflowError:  # an int past float64's range
            return "Infinity" if value > 0 else "-Infinity"
    if value - value == 0:  # finite
        return repr(value)
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


@dataclass(frozen=True)
class RunInfo(OfflineRun):
    """What the run record holds, fixed when the run opens: ``offline-run-<local start time>-<id>/run-<id>.wandb``."""

    DIR_PREFIX = "offline-run-"
    EXTENSION = ".wandb"

    host: str = field(default_factory=socket.gethostname)
    producer: str = "paddle-amp-ext"


def _info(run_id: str) -> bytes:
    return _message(200, _string(1, run_id))  # _RecordInfo.stream_id, as wandb-core tags these records


def header(info: RunInfo) -> bytes:
    """The start of a new file: the magic, the header record (1) and the run record (2), framed."""
    version = _message(1, _string(1, info.producer) + _string(2, MIN_CONSUMER))
    head = _int(1, 1) + _message(21, version) + _info(info.run_id)
    start = _int(1, info.start_ms // 1000) + _int(2, info.start_ms % 1000 * 1_000_000)
    config = _message(1, _string(1, "_wandb") + _bytes_field(b"\x82\x01", b"{}"))  # update {"_wandb": {}}, as W&B's
    run = (_string(1, info.run_id) + _string(3, info.project) + _message(4, config) + _string(8, info.name)
           + _string(13, info.host) + _message(17, start))
    record = _int(1, 2) + _message(17, run) + _info(info.run_id)
    out = MAGIC + frame(head, len(MAGIC))
    return out + frame(record, len(out))


class HistoryStep:
    """One step encoded: its number, its tags and their ``HistoryItem`` fields (numbered and framed
    at write time, by :class:`Sequence`)."""

    __slots__ = ("step", "tags", "items")

    def __init__(self, step: int, tags: List[str], items: List[bytes]) -> None:
        self.step, self.tags, self.items = step, tags, items


class HistoryEncoder:
    """A step as W&B's ``log()`` records it: the values, ``_timestamp`` (seconds), ``_runtime``
    (seconds since the run's start) and ``_step``. Everything of an item but its value is computed
    once per tag and length of the value; an item whose value is the tag's last nonzero one (the
    loss scale, the learning rate, the skip count: most steps) is the last item again."""

    def __init__(self, info: RunInfo) -> None:
        self._start = info.start_ms
        self._prefixes: Dict[Tuple[str, int], bytes] = {}
        self._last: Dict[str, Tuple[float, bytes]] = {}  # per tag, its last nonzero value and item

    def _prefix(self, tag: str, size: int) -> bytes:
        """A HistoryItem (SummaryItem) up to its value's bytes: the item's field and length, its key
        as ``nested_key`` (2, as wandb-core writes a flat key), and the key and length of
        ``value_json`` (16)."""
        body = _string(2, tag) + b"\x82\x01" + varint(size)
        prefix = self._prefixes[(tag, size)] = b"\x0a" + varint(len(body) + size) + body
        return prefix

    def _item(self, tag: str, text: str) -> bytes:
        raw = text.encode("ascii")
        return (self._prefixes.get((tag, len(raw))) or self._prefix(tag, len(raw))) + raw

    def step(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> HistoryStep:
        last, items, tags = self._last, [], []
        for tag, value in values:
            if value.__class__ is float and value - value == 0:  # finite (inline: the usual case)
                kept = last.get(tag)
                if kept is not None and kept[0] == value:  # nonzero, so -0.0 and 0.0 never share an item
                    item = kept[1]
                else:
                    item = self._item(tag, repr(value))
                    if value:
                        last[tag] = (value, item)
            else:
                item = self._item(tag, json_number(value))
            items.append(item)
            tags.append(tag)
        items += (self._item("_timestamp", repr(walltime_ms / 1000)),
                  self._item("_runtime", repr((walltime_ms - self._start) / 1000)), self._item("_step", str(int(step))))
        tags += ("_timestamp", "_runtime", "_step")
        return HistoryStep(step, tags, items)


class Sequence:
    """The records' numbers and the last step: what a write commits once it succeeded.

    W&B keeps a step only if it is above the last one (its ``log()`` drops a negative, repeated or
    earlier step, with a warning): so does :meth:`encode`, warned once.
    """

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.num = 2  # the header and run records
        self.last_step: Optional[int] = None

    def encode(self, steps: List[HistoryStep], offset: int) -> Tuple[bytes, tuple]:
        """``steps`` as framed records from file ``offset`` (history per step, then one summary);
        returns the bytes and the state to :meth:`commit` once they are written."""
        num, last, out, updated, kept = self.num, self.last_step, [], {}, []
        for entry in steps:
            step = entry.step
            if step < 0 or step > _INT64_MAX or (last is not None and step <= last):
                warn_once(f"wandb:step:{id(self)}", "W&B: step %d is not above the last step logged (%s) or not an "
                          "int64 >= 0: not in the W&B run (W&B's log() drops it too; VisualDL and TensorBoard have "
                          "it).", step, last)
                continue
            last, num = step, num + 1
            history = b"".join(entry.items) + (_message(2, b"\x08" + varint(step)) if step
                                               else b"\x12\x00")  # HistoryStep, even empty
            record = b"\x08" + _varint(num) + b"\x12" + _varint(len(history)) + history
            part = frame(record, offset)
            out.append(part)
            offset += len(part)
            kept.append(entry)
        for i, entry in enumerate(reversed(kept)):  # the summary: each key's latest item (one step, usually)
            if not i or entry.tags != kept[-1].tags:
                for tag, item in zip(entry.tags, entry.items):
                    updated.setdefault(tag, item)
        if updated:
            num += 1
            part = frame(_int(1, num) + _message(3, b"".join(updated.values())), offset)
            out.append(part)
        return b"".join(out), (num, last)

    def commit(self, state: tuple) -> None:
        self.num, self.last_step = state

    def exit_records(self, offset: int, now_ms: Optional[int] = None, exit_code: int = 0) -> bytes:
        """The run's end, as W&B's ``finish()`` writes it: a summary of ``_wandb.runtime`` (whole
        seconds) and the exit record (W&B marks a run without one as failed when it syncs it)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        runtime = max(0, min((now_ms - self.info.start_ms) // 1000, (1 << 31) - 1))
        item = _string(2, "_wandb") + _string(2, "runtime") + _bytes_field(b"\x82\x01", str(runtime).encode())
        out = frame(_int(1, self.num + 1) + _message(3, _message(1, item)), offset)
        body = _int(1, exit_code) + _int(2, runtime)
        return out + frame(_int(1, self.num + 2) + _message(18, body) + _info(self.info.run_id), offset + len(out))


def wants_own_file(environ: Optional[dict] = None) -> bool:
    """True unless the user chose a W&B mode other than offline (``WANDB_MODE=online``, ``shared``,
    ``disabled``): then W&B's own library runs (it uploads live), at its own cost."""
    mode = (os.environ if environ is None else environ).get("WANDB_MODE", "").strip().lower()
    return mode in ("", "offline", "dryrun")

