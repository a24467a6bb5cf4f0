"""Rehearsal cost: a training step under ``fp16_emulation`` over the same step in float32.

The protocol of a user's loop: the rehearsal entered around the loop, ``auto_cast`` entered per
step, AdamW, forward + MSE + backward + step + clear_grad; float16 and bfloat16. Three models:

- MLP: 512 wide, three Linear layers, batch 128;
- CNN: two (Conv2D 3x3 + BatchNorm2D + ReLU) blocks, max-pool, Linear head, batch 32 of 3x32x32;
- Transformer: ``nn.TransformerEncoder``, 2 layers, d_model 128, 4 heads, feed-forward 512,
  batch 16 of 64 tokens.

The float32 step is the plain loop (no ``auto_cast``, no rehearsal). The two variants alternate in
short blocks of ``--steps`` steps (the rehearsal entered once per block, around its loop; who goes
first alternates); the ratio is the median of the paired per-block ratios, with the 25th-75th
percentile spread, so drift of a shared machine moves both sides of a pair. Each Paddle is
measured with each rounding kernel: the one-pass native kernels (F16C for float16, integer
round-to-nearest-even for bfloat16; the default where a C compiler built them) and Paddle's
kernels (``PADDLE_AMP_EXT_NATIVE=0``, the fallback). Goal: <= 1.2 for every model, dtype and
Paddle with the default kernels; the fallback's ratios are reported beside them.

    python benchmarks/rehearsal_cost.py                          # every venv found (.venv, .venv-paddle26)
    python benchmarks/rehearsal_cost.py --python A --python B    # these interpreters
    python benchmarks/rehearsal_cost.py --here --dtype bfloat16  # only this interpreter and kernel
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

from matrix import ROOT, VENVS, machine, paired, ratio_stats

GOAL = 1.2
DTYPES = ("float16", "bfloat16")
MODELS = ("MLP", "CNN", "Transformer")


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


def measure_model(build: Callable[[], Any], x_shape: List[int], y_shape: List[int], dtype: str, steps: int,
                  repeats: int, clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    """Paired blocks of ``steps`` training steps: float32, and under ``fp16_emulation(model, dtype)``."""
    import paddle

    import paddle_amp_ext as amp

    paddle.seed(0)
    x, y = paddle.randn(x_shape), paddle.randn(y_shape)
    pairs = []
    for _ in range(2):
        paddle.seed(0)
        model = build()
        pairs.append((model, paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())))

    def step(model: Any, opt: Any) -> None:
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()

    def fp32_block() -> None:
        for _ in range(steps):
            step(*pairs[0])

    def rehearsal_block() -> None:
        model, opt = pairs[1]
        with amp.fp16_emulation(model, dtype):
            for _ in range(steps):
                with amp.auto_cast(dtype=dtype):
                    loss = paddle.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.clear_grad()

    samples = paired({"rehearsal": rehearsal_block, "fp32": fp32_block}, 1, repeats, warmup=2, clock=clock)
    stats = ratio_stats(samples, "rehearsal", "fp32")
    return {"ratio": stats["ratio"], "p25": stats["p25"], "p75": stats["p75"], "fp32_ms": stats["paddle_ms"] / steps}


def kernel_name(dtype: str) -> str:
    """The rounding kernel the rehearsal of ``dtype`` uses in this process."""
    from paddle_amp_ext.rehearsal.rounding import kernel

    return kernel(dtype)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def measure_here(dtypes: List[str], steps: int, repeats: int, only: str | None = None,
                 clock: str = "wall") -> List[Dict[str, Any]]:
    import logging

    import paddle

    logging.getLogger("paddle_amp_ext").setLevel(logging.ERROR)  # the CPU auto_cast notice
    results = []
    for dtype in dtypes:
        rows = {name: measure_model(build, x_shape, y_shape, dtype, steps, repeats, CLOCKS[clock])
                for name, (build, (x_shape, y_shape)) in models().items() if only in (None, name)}
        results.append({"paddle": paddle.__version__, "dtype": dtype, "kernel": kernel_name(dtype), "rows": rows})
    return results


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| model | " + " | ".join(f"Paddle {r['paddle']}, {r['kernel']}" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in results[0]["rows"]:
        cells = []
        for r in results:
            s = r["rows"][name]
            cells.append(f"{s['ratio']:.2f} ({s['p25']:.2f}-{s['p75']:.2f}; fp32 step {s['fp32_ms']:.1f} ms)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def missed(results: List[Dict[str, Any]]) -> List[str]:
    return [f"{r['dtype']} {name} on Paddle {r['paddle']} ({s['ratio']:.2f}x)" for r in results
            if r.get("default", True) for name, s in r["rows"].items() if s["ratio"] > GOAL]


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--here", action="store_true", help="only this interpreter's Paddle and kernel")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (with --here)")
    parser.add_argument("--python", action="append", default=[], help="an interpreter to measure (repeatable)")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="a dtype (repeatable; default both)")
    parser.add_argument("--kernel", choices=("both", "native", "paddle"), default="both")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall time, or the CPU time of the process (without waiting for a core)")
    parser.add_argument("--steps", type=int, default=8, help="training steps per block")
    parser.add_argument("--repeats", type=int, default=11, help="blocks per variant")
    parser.add_argument("--only", metavar="MODEL", choices=MODELS, help="one model")
    args = parser.parse_args(argv)
    dtypes = args.dtype or list(DTYPES)
    if args.here:
        results = measure_here(dtypes, args.steps, args.repeats, args.only, args.clock)
        print(json.dumps(results) if args.json else "\n\n".join(table([r]) for r in results))
        return 0 if not missed(results) else 1
    pythons = args.python or [p for p in (os.path.join(ROOT, v, "bin", "python") for v in VENVS)
                              if os.path.exists(p)] or [sys.executable]
    switches = {"both": ("1", "0"), "native": ("1",), "paddle": ("0",)}[args.kernel]
    results = []
    for python in pythons:
        for switch in switches:  # the default kernels, then the fallback
            cmd = [python, os.path.abspath(__file__), "--here", "--json", "--steps", str(args.steps),
                   "--repeats", str(args.repeats), "--clock", args.clock] + [f"--dtype={d}" for d in dtypes]
            cmd += ["--only", args.only] if args.only else []
            env = {**os.environ, "PYTHONWARNINGS": "ignore", "PADDLE_AMP_EXT_NATIVE": switch,
                   "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if not proc.stdout.strip():
                print(f"{python}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 2
            results += [dict(r, default=switch == "1") for r in json.loads(proc.stdout.strip().splitlines()[-1])]
    print(f"Machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the end; {args.clock} time")
    for dtype in dtypes:
        print(f"\n{dtype} rehearsal step / float32 step (median, 25th-75th percentile):\n")
        print(table([r for r in results if r["dtype"] == dtype]))
    late = missed(results)
    print(f"\nGoal (<= {GOAL}x for every model and dtype, default kernels): "
          + ("met" if not late else "MISSED: " + "; ".join(late)))
    return 0 if not late else 1


if __name__ == "__main__":
    sys.exit(main())
