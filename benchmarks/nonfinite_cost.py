"""What the rehearsal's GPU semantics for inf and NaN cost: a rehearsed step with them / without.

The models of ``rehearsal_cost.py`` (MLP with two ReLUs, CNN with two ReLUs, a Transformer
encoder whose attention calls softmax), trained under ``fp16_emulation``: once as shipped, once
with the fix-ups of :mod:`paddle_amp_ext.rehearsal.nonfinite` turned off (the ops run Paddle's
CPU kernels alone). On finite values each fix-up is one check of its input (relu: its output
gradient): one scan by the compiled finiteness kernel, or a sum and one number read on the host. The two variants alternate in short blocks; the
ratio is the median of the paired per-block ratios, with the 25th-75th percentile spread.

    python benchmarks/nonfinite_cost.py [--steps 4] [--repeats 9]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

from matrix import machine, paired, ratio_stats
from rehearsal_cost import models


def measure(build: Any, x_shape: List[int], y_shape: List[int], steps: int, repeats: int) -> Dict[str, float]:
    import paddle

    import paddle_amp_ext as amp
    from paddle_amp_ext.rehearsal import nonfinite

    paddle.seed(0)
    x, y = paddle.randn(x_shape), paddle.randn(y_shape)
    model = build()
    opt = paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters())
    fixes = dict(nonfinite.FIXES)

    def block(with_fixes: bool) -> None:
        nonfinite.FIXES.clear()
        if with_fixes:
            nonfinite.FIXES.update(fixes)  # read when the rehearsal wraps Paddle's functions
        with amp.fp16_emulation(model):
            for _ in range(steps):
                paddle.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.clear_grad()

    try:
        samples = paired({"fixes": lambda: block(True), "plain": lambda: block(False)}, 1, repeats, warmup=2)
    finally:
        nonfinite.FIXES.clear()
        nonfinite.FIXES.update(fixes)
    return ratio_stats(samples, "fixes", "plain")


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps per block")
    parser.add_argument("--repeats", type=int, default=9, help="blocks per variant")
    args = parser.parse_args(argv)
    import paddle

    print(f"Machine: {machine()}; Paddle {paddle.__version__}\n")
    print("| model | with GPU semantics / without (median, 25th-75th) | rehearsed step |")
    print("|---|---|---|")
    for name, (build, (x_shape, y_shape)) in models().items():
        s = measure(build, x_shape, y_shape, args.steps, args.repeats)
        print(f"| {name} | {s['ratio']:.3f}x ({s['p25']:.3f}-{s['p75']:.3f}) | {s['paddle_ms'] / args.steps:.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
