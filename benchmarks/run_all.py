"""Run every benchmark once and print the ratios (each measured within one run).

    python benchmarks/run_all.py             # this interpreter's Paddle
    python benchmarks/matrix.py              # the per-size matrix, on every Paddle venv found
"""

from __future__ import annotations

import os
import subprocess
import sys

from matrix import machine

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [["matrix.py", "--here"], ["hook_overhead.py"], ["rehearsal_cost.py", "--here"], ["startup_time.py"],
           ["amp_speedup.py"], ["fleet_step.py", "--repeats", "10"]]


def main() -> int:
    print(f"Machine: {machine()}")
    for script, *args in SCRIPTS:
        proc = subprocess.run([sys.executable, os.path.join(HERE, script), *args], capture_output=True, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        print("\n".join(lines) if lines else f"{script}: no output (exit {proc.returncode})\n{proc.stderr[-500:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
