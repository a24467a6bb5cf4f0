"""FP8 rehearsal cost: a training step with ``fp8_linears`` over the same step in float32.

A step: forward, MSE, backward, SGD step, clear_grad. Two shapes:

- small: two Linear layers 256 -> 512 -> 256, batch 64;
- LLaMA-shaped: one LLaMA MLP block (gate, up: hidden -> intermediate, SiLU gate, down:
  intermediate -> hidden) at hidden 1024, intermediate 2816 (LLaMA's 8/3 ratio rounded to 128),
  256 tokens.

Each recipe (blockwise, current, delayed) against float32; then, apart, the float32 step of a
model that has been through ``fp8_linears`` (FP8 off again) against the same step of a twin that
never was, to show that nothing remains on the step when FP8 is off. The variants alternate in blocks (who goes first alternates); the ratio is the
median of the paired per-block ratios with the 25th-75th percentile spread. Goal: <= 1.5.

    python benchmarks/fp8_cost.py [--repeats 9] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict

import numpy as np
import paddle
from matrix import machine, paired, ratio_stats

from paddle_amp_ext import fp8_linears

GOAL = 1.5


class LlamaMlp(paddle.nn.Layer):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate = paddle.nn.Linear(hidden, inter, bias_attr=False)
        self.up = paddle.nn.Linear(hidden, inter, bias_attr=False)
        self.down = paddle.nn.Linear(inter, hidden, bias_attr=False)

    def forward(self, x):
        return self.down(paddle.nn.functional.silu(self.gate(x)) * self.up(x))


def shapes() -> Dict[str, Callable[[], tuple]]:
    def small():
        model = paddle.nn.Sequential(paddle.nn.Linear(256, 512), paddle.nn.ReLU(), paddle.nn.Linear(512, 256))
        return model, paddle.randn([64, 256]), paddle.randn([64, 256])

    def llama():
        return LlamaMlp(1024, 2816), paddle.randn([256, 1024]), paddle.randn([256, 1024])

    return {"small": small, "LLaMA-shaped": llama}


def step_fn(model, x, y, context=None) -> Callable[[], None]:
    opt = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())

    def step():
        if context is None:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
        else:
            with context():
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
        opt.step()
        opt.clear_grad()

    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    paddle.seed(0)
    results = {"machine": machine(), "paddle": paddle.__version__, "numpy": np.__version__, "rows": []}
    ok = True
    for shape, build in shapes().items():
        model, x, y = build()
        variants = {"float32": step_fn(model, x, y)}
        for recipe in ("blockwise", "current", "delayed"):
            variants[recipe] = step_fn(model, x, y, lambda r=recipe, m=model: fp8_linears(m, r))

        samples = paired(variants, args.steps, args.repeats)
        twin, _, _ = build()
        twin.set_state_dict(model.state_dict())
        with fp8_linears(model, "delayed"):
            model(x)
        off = paired({"fp8 off": step_fn(model, x, y), "float32": step_fn(twin, x, y)}, args.steps, args.repeats)
        samples.update(off)
        for name in list(variants)[1:] + ["fp8 off"]:
            stats = ratio_stats(samples, name, "float32")
            goal = GOAL if name != "fp8 off" else 1.05
            ok &= stats["ratio"] <= goal
            row = {"shape": shape, "variant": name, **{k: round(v, 3) for k, v in stats.items()}, "goal": goal}
            results["rows"].append(row)
            print(f"{shape:13s} {name:10s} ratio {stats['ratio']:.2f} [{stats['p25']:.2f}, {stats['p75']:.2f}]  "
                  f"{stats['ours_ms']:.1f} ms vs float32 {stats['paddle_ms']:.1f} ms  (goal <= {goal})")
            sys.stdout.flush()
    print(json.dumps(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
