"""Protocol-buffer wire pieces shared by the record encoders (VisualDL's, TensorBoard's, W&B's and SwanLab's)."""

from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass
from typing import Callable, Dict

_UINT64 = (1 << 64) - 1
_PACK_FLOAT32 = struct.Struct("<f").pack
_INF32, _NEG_INF32 = _PACK_FLOAT32(math.inf), _PACK_FLOAT32(-math.inf)


#: the varints of 0..127: one byte each (lengths, small steps, field keys)
_SHORT = [bytes((n,)) for n in range(128)]
#: a varint's first byte when more follow: the low 7 bits and the continuation bit
_CONTINUED = [bytes((n | 0x80,)) for n in range(128)]
_PACK_U16 = struct.Struct("<H").pack
#: the varints of ``value >> 7`` for values past two bytes: consecutive record numbers, steps and
#: times of a run share them (a time in ms shares one for 128 ms); emptied at 4096 entries
_HIGH: Dict[int, bytes] = {}


def varint(value: int) -> bytes:
    """``value`` as protobuf's varint: a negative int as its 64-bit two's complement (10 bytes), as
    protobuf encodes an int64 (so this always ends); only the low 64 bits of a larger int are kept."""
    if 0 <= value < 0x4000:  # hot (every length, and a step below 16384): one or two bytes, no loop
        return _SHORT[value] if value < 0x80 else _PACK_U16((value & 0x7F | 0x80) | (value >> 7) << 8)
    value &= _UINT64
    if value < 0x4000:  # an int past 64 bits, or a negative one, whose low 64 bits are small
        return varint(value)
    high = _HIGH.get(value >> 7)
    if high is None:
        if len(_HIGH) >= 4096:
            _HIGH.clear()
        high = _HIGH[value >> 7] = _varint_loop(value >> 7)
    return _CONTINUED[value & 0x7F] + high


def _varint_loop(value: int) -> bytes:
    """The varint of an int from 0 to 2**64 - 1, 7 bits a byte."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def length_field(number: int, body: bytes) -> bytes:
    """A length-delimited field ``number`` (a string's bytes or a message)."""
    return varint(number << 3 | 2) + varint(len(body)) + body


def string_field(number: int, value: str) -> bytes:
    """A string field ``number`` (proto3: an empty string is left out)."""
    return length_field(number, value.encode("utf-8")) if value else b""


def int_field(number: int, value: int) -> bytes:
    """A varint field ``number`` (proto3: 0 is left out)."""
    return varint(number << 3) + varint(value) if value else b""


def float32_bytes(value: float) -> bytes:
    """``value`` as a little-endian float32, as protobuf stores a ``float`` field: a finite value
    beyond float32's range (a float64 loss of 1e39) becomes +-inf, NaN and inf stay what they are.

    Raises:
        TypeError: ``value`` is not a real number.
    """
    try:
        return _PACK_FLOAT32(value)
    except (OverflowError, struct.error):  # a finite value that rounds past float32's largest, an int past float64's
        if isinstance(value, numbers.Real):
            return _INF32 if value > 0 else _NEG_INF32
        raise TypeError(f"A recorded value must be a real number. Received: {value!r} "
                        f"(of type {type(value).__name__})") from None


@dataclass(frozen=True)
class FileFormat:
    """A record file format: the prefix its files' names start with, a new file's name (given
    the user's suffix) and its first record (given the wall time in ms)."""

    prefix: str
    name: Callable[[str], str]
    header: Callable[[int], bytes]
