"""Import cost of paddle_amp_ext and wall time of the check CLI, over `python -c "import paddle"`.

    python benchmarks/startup_time.py       # goals: check CLI <= 1.3x, import near 1.0x
"""

from __future__ import annotations

import argparse
import sys

from _timing import report, wall


def main() -> bool:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    py = sys.executable
    base = wall([py, "-c", "import paddle"], args.repeats)
    ours = wall([py, "-c", "import paddle_amp_ext"], args.repeats)
    check = wall([py, "-m", "paddle_amp_ext.check"], args.repeats)
    ok = report("import paddle_amp_ext / import paddle", ours / base, 1.1,
                f"{ours:.2f} s vs {base:.2f} s (VisualDL is not imported)")
    return report("python -m paddle_amp_ext.check / import paddle", check / base, 1.3,
                  f"{check:.2f} s vs {base:.2f} s") and ok


if __name__ == "__main__":
    main()
