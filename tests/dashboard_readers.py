"""Each dashboard's records read back with its own library: {tag: [(step, value), ...]}."""

from __future__ import annotations

import glob
import os
import struct
import zlib


def _one(pattern: str) -> str:
    files = glob.glob(pattern, recursive=True)
    assert len(files) == 1, (pattern, files)
    return files[0]


def read_visualdl(logdir: str) -> dict:
    from visualdl import LogReader

    reader = LogReader(file_path=_one(os.path.join(logdir, "**", "vdlrecords.*")))
    return {tag: [(d.id, d.value) for d in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]}


def read_tensorboard(logdir: str) -> dict:
    """TensorBoard's own reader (``EventAccumulator``) over the run directory of the one event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = os.path.dirname(_one(os.path.join(logdir, "**", "events.out.tfevents.*")))
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_swanlab(logdir: str) -> dict:
    """SwanLab's own reader of its offline store (``run-*.swanlab``) and its record definitions."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(_one(os.path.join(logdir, "**", "run-*.swanlab")))
    out: dict = {}
    try:
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            if record.HasField("scalar"):
                out.setdefault(record.scalar.key, []).append((record.scalar.step, record.scalar.value.number))
    finally:
        reader.close()
    return out


def _leveldb_records(path: str):
    """The records of a W&B transaction log: a 7-byte header, then LevelDB log blocks of 32 KiB."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            return  # a torn tail
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            yield pending
            pending = b""


def read_wandb(logdir: str, timeout: float = 30.0) -> dict:
    """W&B's offline transaction log, parsed with W&B's own record definitions (``wandb_internal_pb2``).

    ``run.finish()`` returns before W&B's service process has written the end of the log (measured
    with wandb 0.31.0): wait for its last record, ``exit``, up to ``timeout`` seconds.
    """
    import json
    import time

    from wandb.proto.wandb_internal_pb2 import Record

    path = _one(os.path.join(logdir, "**", "offline-run-*", "run-*.wandb"))
    deadline = time.monotonic() + timeout
    while True:
        records = []
        for data in _leveldb_records(path):
            record = Record()
            record.ParseFromString(data)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out: dict = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        step = items.pop("_step")
        for tag, value in items.items():
            if not tag.startswith("_"):
                out.setdefault(tag, []).append((step, float(value) if not isinstance(value, str) else float(value)))
    return out
