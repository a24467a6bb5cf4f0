"""TensorBoard's event file, written here without importing TensorBoard or tensorboardX.

An event file ``events.out.tfevents.<unix time>.<host>.<pid>.<n>`` is a sequence of TFRecords:
a little-endian uint64 length, its masked CRC-32C (uint32), a serialized ``tensorboard.Event``
and the data's masked CRC-32C. The first event holds ``file_version = "brain.Event:2"``; then
one event per step: ``wall_time`` (field 1, double, seconds), ``step`` (2, varint) and a
``Summary`` (5) with one ``Value`` per metric: ``tag`` (1) and ``simple_value`` (2, float32).
The bytes are those TensorBoard's own ``EventFileWriter`` writes for the same ``Event`` (the
tests compare them), so TensorBoard's reader and dashboard read them.

The CRC-32C comes from the ``crc32c`` package (or ``google-crc32c``) when installed, else from a
table here (pure Python, ~40x slower; it runs only in a flush, never at a step).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Callable, List, Tuple

from ._wire import FileFormat, float32_bytes, varint


def _table_crc32c() -> Callable[[bytes], int]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)

    def crc32c(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for byte in data:
            crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF

    return crc32c


def _crc32c_function() -> Callable[[bytes], int]:
    try:
        from crc32c import crc32c as fast  # the crc32c package (a C extension)

        return fast
    except ImportError:
        pass
    try:
        import google_crc32c  # google-crc32c

        return google_crc32c.value
    except ImportError:
        return _table_crc32c()


crc32c = _crc32c_function()
_U32 = struct.Struct("<I").pack
_U64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return _U32((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def framed(event: bytes) -> bytes:
    """``event`` as one TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = _U64(len(event))
    return length + _masked(length) + event + _masked(event)


PREFIX = "events.out.tfevents."


def file_name(suffix: str = "") -> str:
    """A new event file's name, as TensorBoard's ``EventFileWriter`` names it (found by ``tfevents``)."""
    return f"{PREFIX}{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.0{suffix}"


def header(walltime_ms: int) -> bytes:
    """The first record of a file: ``Event(wall_time=..., file_version="brain.Event:2")``."""
    version = b"brain.Event:2"
    return framed(b"\x09" + _DOUBLE(walltime_ms / 1000) + b"\x1a" + varint(len(version)) + version)


class EventEncoder:
    """One ``Event`` per step holding every value of the step: ``step()`` returns its TFRecord bytes.

    The tag fields are computed once per tag; a step costs one struct pack per value and two
    CRC-32Cs.
    """

    def __init__(self) -> None:
        self._tags: dict = {}  # tag -> the Value's field key and length, tag field and simple_value key

    def _tag(self, tag: str) -> bytes:
        raw = tag.encode("utf-8")
        field = b"\x0a" + varint(len(raw)) + raw + b"\x15"
        value = self._tags[tag] = b"\x0a" + varint(len(field) + 4) + field
        return value

    def step(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> bytes:
        tags, parts = self._tags, []
        for tag, value in values:
            parts += (tags.get(tag) or self._tag(tag), float32_bytes(value))
        summary = b"".join(parts)
        head = b"\x09" + _DOUBLE(walltime_ms / 1000) if walltime_ms else b""
        if step:
            head += b"\x10" + varint(step)  # int64: a negative step as its two's complement
        return framed(head + b"\x2a" + varint(len(summary)) + summary)


#: how :class:`paddle_amp_ext.visualdl.records.RecordFile` names and starts an event file
FORMAT = FileFormat(PREFIX, file_name, header)
