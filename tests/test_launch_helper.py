"""The launch helper's hard timeout kills the whole tree: the launcher's process group and the
descendants that started sessions of their own (paddle.distributed.launch's workers on 3.3.1)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from distributed import descendants, kill_tree

# a parent that starts a child in a new session (as 3.3.1's launch starts its workers), prints its pid, waits
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_kill_tree_reaches_a_child_in_its_own_session():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        assert child in descendants(parent.pid)
        assert os.getsid(child) != os.getsid(parent.pid)  # killpg of the parent's group would miss it
        kill_tree(parent.pid)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_kill_tree_of_a_process_that_is_gone_is_quiet():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    kill_tree(proc.pid)  # no ProcessLookupError
    assert descendants(proc.pid) == []
