"""Protocol-buffer wire pieces shared by the record encoders (VisualDL's and TensorBoard's)."""

from __future__ import annotations

import math
import struct

_FLOAT32 = struct.Struct("<f").pack


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def float32_bytes(value: float) -> bytes:
    """``value`` as a little-endian float32, as numpy casts it: beyond float32's range it is +-inf
    (``struct`` would raise OverflowError)."""
    try:
        return _FLOAT32(value)
    except OverflowError:
        return _FLOAT32(math.copysign(math.inf, value))
