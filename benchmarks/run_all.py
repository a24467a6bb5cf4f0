"""Run every benchmark once and print the ratios (each measured within one run).

    python benchmarks/run_all.py
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ["step_time.py", "hook_overhead.py", "emulation_cost.py", "startup_time.py", "amp_speedup.py"]


def main() -> int:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for script in SCRIPTS:
        proc = subprocess.run([sys.executable, os.path.join(HERE, script)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        print("\n".join(lines) if lines else f"{script}: no output (exit {proc.returncode})\n{proc.stderr[-500:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
