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


def swanlab_records(logdir: str) -> list:
    """Every record of the one SwanLab offline run under ``logdir``, read with SwanLab's own reader
    (``DataStoreReader``, the one ``swanlab sync`` uses) and record definitions."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(_one(os.path.join(logdir, "**", "run-*.swanlab")))
    try:
        return [Record.FromString(data) for data in reader]
    finally:
        reader.close()


def _leveldb_records(path: str):
    """The records of a W&B transaction log file (see :func:`leveldb_payloads`)."""
    with open(path, "rb") as f:
        return list(leveldb_payloads(f.read()))


def leveldb_payloads(data: bytes):
    """The records of a W&B transaction log: a 7-byte header, then LevelDB log blocks of 32 KiB."""
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


def wandb_records(logdir: str, wait: float = 0.0) -> list:
    """Every record of the one W&B offline run under ``logdir``, parsed with W&B's own record
    definitions (``wandb_internal_pb2.Record``).

    W&B's own run (``WANDB_MODE=online``...): ``run.finish()`` returns before W&B's service process
    has written the end of the log (measured with wandb 0.31.0): ``wait`` up to that many seconds
    for its last record, ``exit``. The file this package writes is complete when the hook closes.
    """
    import time

    from wandb.proto.wandb_internal_pb2 import Record

    path = _one(os.path.join(logdir, "**", "offline-run-*", "run-*.wandb"))
    deadline = time.monotonic() + wait
    while True:
        records = []
        for data in _leveldb_records(path):
            record = Record()
            record.ParseFromString(data)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() >= deadline:
            return records
        time.sleep(0.1)


def history_items(record) -> dict:
    """A history (or summary) record's items as {key: value}."""
    import json

    items = record.history.item if record.WhichOneof("record_type") == "history" else record.summary.update
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_wandb(logdir: str, wait: float = 0.0) -> dict:
    """W&B's offline run: {tag: [(step, value), ...]} from its history records (see :func:`wandb_records`)."""
    out: dict = {}
    for record in wandb_records(logdir, wait):
        if record.WhichOneof("record_type") != "history":
            continue
        items = history_items(record)
        step = items.pop("_step")
        assert step == record.history.step.num, (step, record)
        for tag, value in items.items():
            if not tag.startswith("_"):
                out.setdefault(tag, []).append((step, float(value)))
    return out


def wandb_inspect(path: str) -> list:
    """W&B's own reader (``wandb leet inspect --json``, wandb-core's reader of the transaction log,
    offline): one dict per record."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", path], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, WANDB_MODE="offline"),
                          cwd=os.path.dirname(os.path.abspath(path)))  # W&B's CLI logs into ./wandb
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
