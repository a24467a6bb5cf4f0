"""Helper: run a script with `paddle.distributed.launch --nproc_per_node 2` on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def launch(script: Path, *args: str, log_dir: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # launch fails if set
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
           "--log_dir", str(log_dir), str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(log_dir.glob("*")) if p.is_file())
        raise AssertionError(f"launch failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}\n{logs}")
    return proc
