"""fp16 rehearsal cost: a training step under ``fp16_emulation`` / the same step in float32.

Three models, each trained by Adam on MSE, forward + backward + step + clear_grad:

- MLP: 512 wide, three Linear layers, batch 128;
- CNN: two (Conv2D 3x3 + BatchNorm2D + ReLU) blocks, max-pool, Linear head, batch 32 of 3x32x32;
- Transformer: ``nn.TransformerEncoder``, 2 layers, d_model 128, 4 heads, feed-forward 512,
  batch 16 of 64 tokens.

The two variants alternate in short blocks (the rehearsal entered once per block, as a
training loop enters it once); the ratio is the median of the paired per-block ratios, with the
25th-75th percentile spread. Each Paddle is measured with each float16 rounding kernel: the
one-pass F16C kernel (the default where a C compiler built it) and Paddle's thirteen float32
kernels (``PADDLE_AMP_EXT_NATIVE=0``, the fallback). Goal: <= 1.3 for every model on every
Paddle with the default kernel; the fallback's ratios are reported beside it.

    python benchmarks/rehearsal_cost.py                 # every venv found (.venv, .venv-paddle26)
    python benchmarks/rehearsal_cost.py --here          # only this interpreter's Paddle and kernel
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Tuple

from matrix import ROOT, VENVS, machine, paired, ratio_stats

GOAL = 1.3


def models() -> Dict[str, Tuple[Callable[[], Any], Tuple[List[int], List[int]]]]:
    import paddle

    nn = paddle.nn

    def mlp() -> Any:
        return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))

    def cnn() -> Any:
        return nn.Sequential(nn.Conv2D(3, 32, 3, padding=1), nn.BatchNorm2D(32), nn.ReLU(),
                             nn.Conv2D(32, 64, 3, padding=1), nn.BatchNorm2D(64), nn.ReLU(),
                             nn.MaxPool2D(4), nn.Flatten(), nn.Linear(64 * 8 * 8, 1))

    class Transformer(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.1)
            self.encoder = nn.TransformerEncoder(layer, 2)
            self.head = nn.Linear(128, 1)

        def forward(self, x: Any) -> Any:
            return self.head(self.encoder(x)).mean(axis=1)

    return {"MLP": (mlp, ([128, 512], [128, 1])), "CNN": (cnn, ([32, 3, 32, 32], [32, 1])),
            "Transformer": (Transformer, ([16, 64, 128], [16, 1]))}


def measure_model(build: Callable[[], Any], x_shape: List[int], y_shape: List[int], steps: int,
                  repeats: int) -> Dict[str, float]:
    """Paired blocks of ``steps`` training steps: float32, and under ``fp16_emulation``."""
    import paddle

    import paddle_amp_ext as amp

    paddle.seed(0)
    x, y = paddle.randn(x_shape), paddle.randn(y_shape)
    pairs = []
    for _ in range(2):
        paddle.seed(0)
        model = build()
        pairs.append((model, paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters())))

    def train(model: Any, opt: Any) -> None:
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()

    def fp32_block() -> None:
        for _ in range(steps):
            train(*pairs[0])

    def rehearsal_block() -> None:
        with amp.fp16_emulation(pairs[1][0]):
            for _ in range(steps):
                train(*pairs[1])

    samples = paired({"rehearsal": rehearsal_block, "fp32": fp32_block}, 1, repeats, warmup=2)
    stats = ratio_stats(samples, "rehearsal", "fp32")
    return {"ratio": stats["ratio"], "p25": stats["p25"], "p75": stats["p75"], "fp32_ms": stats["paddle_ms"] / steps}


def measure_here(steps: int, repeats: int, only: str | None = None) -> Dict[str, Any]:
    import paddle

    from paddle_amp_ext._native import status

    rows = {name: measure_model(build, x_shape, y_shape, steps, repeats)
            for name, (build, (x_shape, y_shape)) in models().items() if only in (None, name)}
    return {"paddle": paddle.__version__, "kernel": "F16C kernel" if status().available else "Paddle kernels",
            "rows": rows}


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| model | " + " | ".join(f"Paddle {r['paddle']}, {r['kernel']}" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in results[0]["rows"]:
        cells = []
        for r in results:
            s = r["rows"][name]
            cells.append(f"{s['ratio']:.2f}x ({s['p25']:.2f}-{s['p75']:.2f}; fp32 step {s['fp32_ms']:.1f} ms)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--here", action="store_true", help="only this interpreter's Paddle")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (with --here)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per block")
    parser.add_argument("--repeats", type=int, default=15, help="blocks per variant")
    parser.add_argument("--only", metavar="MODEL", choices=("MLP", "CNN", "Transformer"), help="one model")
    args = parser.parse_args(argv)
    if args.here:
        result = measure_here(args.steps, args.repeats, args.only)
        print(json.dumps(result) if args.json else table([result]))
        return 0 if all(s["ratio"] <= GOAL for s in result["rows"].values()) else 1
    pythons = [p for p in (os.path.join(ROOT, v, "bin", "python") for v in VENVS) if os.path.exists(p)]
    results = []
    for python in pythons or [sys.executable]:
        for switch in ("1", "0"):  # the default kernel, then the fallback
            cmd = [python, os.path.abspath(__file__), "--here", "--json", "--steps", str(args.steps),
                   "--repeats", str(args.repeats)] + (["--only", args.only] if args.only else [])
            env = {**os.environ, "PYTHONWARNINGS": "ignore", "PADDLE_AMP_EXT_NATIVE": switch}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if not proc.stdout.strip():
                print(f"{python}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 2
            results.append(dict(json.loads(proc.stdout.strip().splitlines()[-1]), default=switch == "1"))
    print(f"Machine: {machine()}\n\nfp16 rehearsal step / float32 step (median, 25th-75th percentile):\n")
    print(table(results))
    missed = [f"{name} on Paddle {r['paddle']} ({s['ratio']:.2f}x)" for r in results if r["default"]
              for name, s in r["rows"].items() if s["ratio"] > GOAL]
    print(f"\nGoal (<= {GOAL}x for every model, default kernel): "
          + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
