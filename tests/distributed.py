"""Helper: run a script with `paddle.distributed.launch --nproc_per_node N` on the CPU (gloo).

Every launch has a hard timeout: on expiry the launcher, its process group and every
descendant (3.3.1's workers start sessions of their own) are killed and the test fails with
the workers' logs, so a hang costs seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

#: gloo's message when a rank connects before its peer listens, or to a port another launch on the
#: machine took: the launch never reached the script's first collective, so it is started again.
_NOT_CONNECTED = "Connection refused"


def launch(script: Path, *args: str, log_dir: Path, nproc: int = 2, timeout: int = 120,
           attempts: int = 3, python: str = sys.executable) -> subprocess.CompletedProcess:
    """Run ``script`` under ``paddle.distributed.launch`` of ``python`` (default: this one; a
    toolkit's venv for its Trainer); a launch whose ranks never connected (gloo's "Connection
    refused" in the logs) is tried again, up to ``attempts`` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            return _launch_once(script, *args, log_dir=log_dir, nproc=nproc, timeout=timeout, python=python)
        except AssertionError as exc:
            if attempt == attempts or _NOT_CONNECTED not in str(exc):
                raise
            for path in log_dir.glob("*"):  # the next attempt's logs alone
                if path.is_file():
                    path.unlink()
    raise AssertionError("unreachable")


def _launch_once(script: Path, *args: str, log_dir: Path, nproc: int, timeout: int,
                 python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # launch fails if set
    # Paddle 2.6.2's DistributedStrategy needs the pure-python protobuf with protobuf >= 5
    # (dist_scripts/fleet_common.py gives its descriptors back the removed `label`).
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    cmd = [python, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(log_dir), str(script), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"launch of {script.name} hung: killed after {timeout} s\n{_logs(log_dir)}") from None
    if proc.returncode != 0:
        raise AssertionError(f"launch failed ({proc.returncode}):\n{out[-2000:]}\n{err[-2000:]}\n{_logs(log_dir)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def descendants(pid: int) -> list:
    """Every live descendant of ``pid`` (read from /proc), children first."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile, or unreadable
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant of ``pid``: paddle.distributed.launch's
    workers on 3.3.1 start sessions of their own, so killing the launcher's group alone leaves them
    running. The descendants are collected before anything is killed (a worker whose launcher
    died is re-parented and no longer found)."""
    victims = descendants(pid)
    for target in ("group", *victims):
        try:
            os.killpg(pid, signal.SIGKILL) if target == "group" else os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _logs(log_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(log_dir.glob("*")) if p.is_file())
