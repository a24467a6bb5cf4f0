"""Rank 0's VisualDL records survive a dying fleet job: 4 ranks in two launchers
(``--nnodes 2 --master 127.0.0.1:PORT``), paddle.DataParallel, one rank of the other launcher
hangs after a step and is SIGKILLed; rank 0 (waiting in the all-reduce, then killed by gloo's
error with no Python run) must have every step it finished in its records."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("visualdl")
from visualdl import LogReader  # noqa: E402

SCRIPT = Path(__file__).parent.parent / "dist_scripts" / "visualdl_dying_job.py"
TAGS = ["amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_int(path: Path):
    try:
        text = path.read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def logs(tmp_path: Path) -> str:
    return "\n".join(f"== {p}\n" + p.read_text(errors="replace")[-2500:]
                     for p in sorted(tmp_path.glob("log*/*")) if p.is_file())


@pytest.mark.slow
def test_a_sigkilled_rank_leaves_rank_zeros_records_complete(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"  # Paddle 2.6.2's DistributedStrategy
    master, victim, hang_at = f"127.0.0.1:{free_port()}", 3, 60
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "paddle.distributed.launch", "--nnodes", "2", "--master", master, "--rank", str(node),
         "--nproc_per_node", "2", "--log_dir", str(tmp_path / f"log{node}"), str(SCRIPT), str(tmp_path),
         str(victim), str(hang_at)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True) for node in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        progress = {r: tmp_path / "progress" / f"rank{r}" for r in range(4)}
        while not (read_int(progress[victim]) == hang_at and read_int(progress[0]) == hang_at):
            assert time.monotonic() < deadline, f"the job did not reach step {hang_at}\n{logs(tmp_path)}"
            assert all(p.poll() is None for p in launchers), f"a launcher ended early\n{logs(tmp_path)}"
            time.sleep(0.1)
        time.sleep(2.5)  # rank 0 waits in step hang_at + 1's all-reduce: no further step, more than the 1 s bound
        assert read_int(progress[0]) == hang_at
        os.kill(read_int(tmp_path / "pids" / f"rank{victim}"), signal.SIGKILL)
        for proc in launchers:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in launchers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    last = read_int(tmp_path / "progress" / "rank0")
    assert last == hang_at, "rank 0 finished no step after the victim hung"
    assert all(proc.returncode != 0 for proc in launchers), "the job died"
    (path,) = glob.glob(str(tmp_path / "runs" / "job" / "vdlrecords.*"))
    reader = LogReader(file_path=path)
    for tag in TAGS:
        assert [d.id for d in reader.get_data("scalar", tag)] == list(range(last + 1)), (tag, logs(tmp_path))
    assert not glob.glob(str(tmp_path / "runs" / "job" / "rank*")), "only rank 0 logs"
