"""Rank 0's VisualDL records survive a dying data-parallel job: 4 ranks in two launchers
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
from distributed import kill_tree  # noqa: E402
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
                      for p in sorted(tmp_path.glob("log*/workerlog.*")))


def run_job(out: Path, victim: int, hang_at: int) -> bool:
    """Launch the job in two launchers, kill ``victim`` once it hangs; False if the job never
    started (gloo's connect refused while the group is built on a loaded machine)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"  # Paddle 2.6.2's DistributedStrategy
    master = f"127.0.0.1:{free_port()}"
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "paddle.distributed.launch", "--nnodes", "2", "--master", master, "--rank", str(node),
         "--nproc_per_node", "2", "--log_dir", str(out / f"log{node}"), str(SCRIPT), str(out), str(victim),
         str(hang_at)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True) for node in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        progress = {r: out / "progress" / f"rank{r}" for r in range(4)}
        while not (read_int(progress[victim]) == hang_at and read_int(progress[0]) == hang_at):
            assert time.monotonic() < deadline, f"the job did not reach step {hang_at}\n{logs(out)}"
            if any(p.poll() is not None for p in launchers):
                assert read_int(progress[0]) is None, f"a launcher ended mid-run\n{logs(out)}"
                assert "Connection refused" in logs(out), f"a launcher ended before step 0\n{logs(out)}"
                return False
            time.sleep(0.1)
        time.sleep(2.5)  # rank 0 waits in step hang_at + 1's all-reduce: no further step, more than the 1 s bound
        assert read_int(progress[0]) == hang_at
        os.kill(read_int(out / "pids" / f"rank{victim}"), signal.SIGKILL)
        for proc in launchers:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in launchers:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
    assert all(proc.returncode != 0 for proc in launchers), "the job died"
    return True


@pytest.mark.slow
def test_a_sigkilled_rank_leaves_rank_zeros_records_complete(tmp_path):
    victim, hang_at = 3, 60
    for attempt in range(3):
        out = tmp_path / f"attempt{attempt}"
        if run_job(out, victim, hang_at):
            break
    else:
        pytest.fail("gloo refused the connections three times while the group was built")
    last = read_int(out / "progress" / "rank0")
    assert last == hang_at, "rank 0 finished no step after the victim hung"
    (path,) = glob.glob(str(out / "runs" / "job" / "vdlrecords.*"))
    reader = LogReader(file_path=path)
    for tag in TAGS:
        assert [d.id for d in reader.get_data("scalar", tag)] == list(range(last + 1)), (tag, logs(out))
    assert not glob.glob(str(out / "runs" / "job" / "rank*")), "only rank 0 logs"
