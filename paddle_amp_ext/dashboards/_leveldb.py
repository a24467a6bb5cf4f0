"""LevelDB's log format, the framing of W&B's and SwanLab's offline run files.

Blocks of 32 KiB; each record one or more chunks, a chunk being its CRC-32 (the IEEE one, over the
chunk type and the data), its length (uint16), its type (1 full, 2 first, 3 middle, 4 last) and
the data; a chunk header never straddles a block (fewer than 7 bytes left: zeros), a record may.
W&B's ``leveldb.Writer`` (``core/pkg/leveldb/record.go``) and SwanLab's ``DataStoreWriter``
(``swanlab/sdk/internal/core_python/store``, "borrowed from W&B") write it the same way.
"""

from __future__ import annotations

import struct
import zlib

BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_PACK_CHUNK = struct.Struct("<IHB").pack
_FULL_SEED = zlib.crc32(bytes((_FULL,)))


def frame(data: bytes, offset: int) -> bytes:
    """``data`` as one record of the log written at file ``offset``: its chunks, with the zeros
    that end a block when fewer than 7 bytes are left in it (as ``leveldb.Writer`` does)."""
    pos = offset % BLOCK
    if pos + _CHUNK_HEADER + len(data) <= BLOCK:  # the usual case: one full chunk
        return _PACK_CHUNK(zlib.crc32(data, _FULL_SEED), len(data), _FULL) + data
    out = []
    if pos + _CHUNK_HEADER > BLOCK:
        out.append(b"\x00" * (BLOCK - pos))
        pos = 0
    start, first = 0, True
    while True:
        take = min(BLOCK - pos - _CHUNK_HEADER, len(data) - start)
        chunk = data[start:start + take]
        start += take
        last = start == len(data)
        kind = (_FULL if first else _LAST) if last else (_FIRST if first else _MIDDLE)
        out.append(_PACK_CHUNK(zlib.crc32(chunk, zlib.crc32(bytes((kind,)))), take, kind) + chunk)
        if last:
            return b"".join(out)
        pos, first = 0, False
