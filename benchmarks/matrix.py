"""The per-step cost matrix: paddle_amp_ext vs the bare ``paddle.amp`` loop, at every model size.

For each model (small MLP, mid MLP with millions of parameters in few tensors, hundreds and
thousands of small tensors, a small TransformerEncoder), plain and under fp16 rehearsal:

- whole step: ``scale/backward/step(grad_clip=1.0)/update/clear_grad`` with our GradScaler vs
  Paddle's GradScaler with ``ClipGradByGlobalNorm(1.0)`` on the optimizer, both on the real
  scaler machinery (on a CPU inside ``fp16_emulation``; "plain" black-lists matmul so nothing is
  rounded and only the scalers differ, "rehearsal" rounds as fp16 AMP would, for both loops);
- clip alone: our in-place clip vs ``ClipGradByGlobalNorm`` on the same gradients, and the
  difference per parameter tensor;
- hook: ``VisualDLHook.on_step`` per logged step, flushes included (microseconds);
- loss scaling off (bfloat16, float32, a CPU): our step with the non-finite guard vs Paddle's
  disabled scaler, both clipping (the guard reuses the clip's norm and reads one flag);
- host reads: device-to-host reads per step, ours minus Paddle's (counted, not timed).

Each ratio is the median of paired per-repeat ratios (both variants back to back in short
blocks, many times), with the 25th-75th percentile spread.

    python benchmarks/matrix.py                      # every venv found (.venv, .venv-paddle26)
    python benchmarks/matrix.py --here               # only this interpreter's Paddle
    python benchmarks/matrix.py --quick              # fewer repeats (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENVS = (".venv", ".venv-paddle26")


# --------------------------------------------------------------------------- measurement
def paired(variants: Dict[str, Callable[[], None]], steps: int, repeats: int, warmup: int = 3,
           clock: Callable[[], float] = time.perf_counter) -> Dict[str, List[float]]:
    """Seconds per call of each variant, per repeat; the variants alternate in short blocks.
    ``clock``: wall time, or ``time.process_time`` (the CPU time of every thread of the process:
    on a loaded machine, without the time spent waiting for a core)."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    order = list(variants)
    for r in range(repeats):
        for name in order if r % 2 == 0 else reversed(order):  # alternate who goes first
            fn = variants[name]
            start = clock()
            for _ in range(steps):
                fn()
            samples[name].append((clock() - start) / steps)
    return samples


def ratio_stats(samples: Dict[str, List[float]], num: str, den: str) -> Dict[str, float]:
    ratios = sorted(a / b for a, b in zip(samples[num], samples[den]))
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [ratios[0], statistics.median(ratios), ratios[-1]]
    return {"ratio": statistics.median(ratios), "p25": q[0], "p75": q[2],
            "ours_ms": statistics.median(samples[num]) * 1e3, "paddle_ms": statistics.median(samples[den]) * 1e3}


class HostReads:
    """Counts Tensor.numpy/item/__float__/tolist calls (each one a device-to-host read)."""

    NAMES = ("numpy", "item", "__float__", "tolist")

    def __init__(self) -> None:
        import paddle

        self.count = 0
        self._paddle = paddle
        self._saved: Dict[str, Any] = {}

    def __enter__(self) -> HostReads:
        cls = self._paddle.Tensor
        for name in self.NAMES:
            original = getattr(cls, name)
            self._saved[name] = original

            def counted(tensor, *a, _orig=original, **k):
                self.count += 1
                return _orig(tensor, *a, **k)

            setattr(cls, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(self._paddle.Tensor, name, original)


# --------------------------------------------------------------------------- models
def models(quick: bool) -> Dict[str, Dict[str, Any]]:
    import paddle

    def mlp(width: int, depth: int, inputs: int):
        layers, size = [], inputs
        for _ in range(depth):
            layers += [paddle.nn.Linear(size, width), paddle.nn.ReLU()]
            size = width
        layers.append(paddle.nn.Linear(size, 1))
        return paddle.nn.Sequential(*layers)

    def transformer():
        layer = paddle.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0)
        body = paddle.nn.TransformerEncoder(layer, num_layers=2)

        class Net(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.body, self.head = body, paddle.nn.Linear(64, 1)

            def forward(self, x):
                return self.head(self.body(x).mean(axis=1))

        return Net()

    return {
        "small MLP": dict(build=lambda: mlp(256, 2, 256), x=[64, 256], steps=20, repeats=15 if quick else 41),
        "mid MLP": dict(build=lambda: mlp(1024, 2, 512), x=[64, 512], steps=5, repeats=9 if quick else 31),
        "400 small tensors": dict(build=lambda: mlp(16, 199, 16), x=[16, 16], steps=5, repeats=9 if quick else 31),
        "2000 small tensors": dict(build=lambda: mlp(8, 999, 8), x=[8, 8], steps=2, repeats=5 if quick else 21),
        "TransformerEncoder": dict(build=transformer, x=[8, 16, 64], steps=10, repeats=9 if quick else 31),
    }


def measure_model(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One row of the matrix: whole step plain and under rehearsal, clip alone, host reads."""
    import paddle

    import paddle_amp_ext as amp
    from paddle_amp_ext import _compat
    from paddle_amp_ext.clip import clip_grads_

    paddle.seed(0)
    x = paddle.randn(spec["x"])
    y = paddle.randn([spec["x"][0], 1])

    def setup(clip_in_optimizer: bool):
        paddle.seed(0)
        model = spec["build"]()
        clip = paddle.nn.ClipGradByGlobalNorm(1.0) if clip_in_optimizer else None
        return model, paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters(), grad_clip=clip)

    ours_model, ours_opt = setup(False)
    theirs_model, theirs_opt = setup(True)
    ours = amp.GradScaler(init_loss_scaling=2.0**10)
    theirs = paddle.amp.GradScaler(enable=False)
    _compat.init_scaler_state(theirs, 2.0**10)  # Paddle disables itself on a CPU; switch it back on
    _compat.set_scaler_enabled(theirs, True)
    theirs._incr_ratio, theirs._decr_ratio = 2.0, 0.5
    theirs._incr_every_n_steps, theirs._decr_every_n_nan_or_inf = 2000, 1

    def ours_step():
        loss = paddle.nn.functional.mse_loss(ours_model(x), y)
        ours.scale(loss).backward()
        ours.step(ours_opt, grad_clip=1.0)
        ours.update()
        ours_opt.clear_grad()

    def theirs_step():
        loss = paddle.nn.functional.mse_loss(theirs_model(x), y)
        theirs.scale(loss).backward()
        theirs.step(theirs_opt)
        theirs.update()
        theirs_opt.clear_grad()

    both = paddle.nn.Sequential(ours_model, theirs_model)
    variants = {"ours": ours_step, "paddle": theirs_step}
    row: Dict[str, Any] = {"tensors": len(ours_model.parameters()),
                           "params": sum(int(p.size) for p in ours_model.parameters())}
    with amp.fp16_emulation(both, custom_black_list=["matmul"]):
        row["plain"] = ratio_stats(paired(variants, spec["steps"], spec["repeats"]), "ours", "paddle")
        with HostReads() as ours_reads:
            for _ in range(3):
                ours_step()
        with HostReads() as paddle_reads:
            for _ in range(3):
                theirs_step()
        row["added_host_reads_per_step"] = (ours_reads.count - paddle_reads.count) / 3
    with amp.fp16_emulation(both):
        row["rehearsal"] = ratio_stats(paired(variants, spec["steps"], spec["repeats"]), "ours", "paddle")

    # loss scaling off (bfloat16, float32, a CPU): our non-finite guard vs Paddle's disabled scaler
    off_ours, off_theirs = amp.GradScaler(enable=False), paddle.amp.GradScaler(enable=False)

    def off_ours_step():
        off_ours.scale(paddle.nn.functional.mse_loss(ours_model(x), y)).backward()
        off_ours.step(ours_opt, grad_clip=1.0)
        off_ours.update()
        ours_opt.clear_grad()

    def off_theirs_step():
        off_theirs.scale(paddle.nn.functional.mse_loss(theirs_model(x), y)).backward()
        off_theirs.step(theirs_opt)
        off_theirs.update()
        theirs_opt.clear_grad()

    row["scaling_off"] = ratio_stats(paired({"ours": off_ours_step, "paddle": off_theirs_step}, spec["steps"],
                                            spec["repeats"]), "ours", "paddle")
    with HostReads() as ours_reads:
        off_ours_step()
    with HostReads() as paddle_reads:
        off_theirs_step()
    row["scaling_off_added_reads"] = ours_reads.count - paddle_reads.count

    # clip alone, on the same gradients
    paddle.nn.functional.mse_loss(ours_model(x), y).backward()
    params = [p for p in ours_model.parameters() if p.grad is not None]
    paddle_clip = paddle.nn.ClipGradByGlobalNorm(1.0)
    ours_clip = paddle.nn.ClipGradByGlobalNorm(1.0)
    pairs = [(p, p._grad_ivar()) for p in params]
    clip = paired({"ours": lambda: clip_grads_(pairs, ours_clip), "paddle": lambda: paddle_clip(pairs)},
                  steps=spec["steps"] * 4, repeats=spec["repeats"])
    stats = ratio_stats(clip, "ours", "paddle")
    stats["us_per_tensor_diff"] = (stats["ours_ms"] - stats["paddle_ms"]) * 1e3 / len(params)
    row["clip"] = stats
    ours_opt.clear_grad()
    return row


def measure_here(quick: bool, only: str | None = None) -> Dict[str, Any]:
    """Run the matrix with this interpreter's Paddle; returns JSON-able results."""
    import logging

    import paddle

    import paddle_amp_ext as amp
    from paddle_amp_ext.events import StepEvent, StepResult

    logging.getLogger("paddle_amp_ext").setLevel(logging.ERROR)
    out: Dict[str, Any] = {"paddle": paddle.__version__, "rows": {}}
    for name, spec in models(quick).items():
        if only is None or name == only:
            out["rows"][name] = measure_model(spec)

    # hook: on_step per logged step, flushes included
    with tempfile.TemporaryDirectory() as tmp:
        hook = amp.VisualDLHook(tmp)
        loss, norm = paddle.to_tensor(0.5), paddle.to_tensor(1.0)
        event = StepEvent(0, loss, StepResult(False, 1024.0, norm), 1e-4, 1024.0)
        n = 2000 if quick else 20000
        for _ in range(100):
            hook.on_step(event)
        start = time.perf_counter()
        for _ in range(n):
            hook.on_step(event)
        hook.flush()
        out["hook_us_per_step"] = (time.perf_counter() - start) / n * 1e6
        hook.close()
    return out


# --------------------------------------------------------------------------- report
def table(results: List[Dict[str, Any]]) -> str:
    def fmt(s: Dict[str, float]) -> str:
        return f"{s['ratio']:.3f} ({s['p25']:.3f}-{s['p75']:.3f})"

    versions = [r["paddle"] for r in results]
    head = "| model | tensors | measure | " + " | ".join(f"Paddle {v}" for v in versions) + " |"
    lines = [head, "|" + "---|" * (3 + len(versions))]
    names = list(results[0]["rows"])
    for name in names:
        first = results[0]["rows"][name]
        label = f"{name} | {first['tensors']} ({first['params'] / 1e6:.2f} M params)"
        for key, what in (("plain", "whole step, plain"), ("rehearsal", "whole step, fp16 rehearsal"),
                          ("scaling_off", "whole step, loss scaling off (non-finite guard)"),
                          ("clip", "clip alone")):
            cells = [fmt(r["rows"][name][key]) for r in results]
            lines.append(f"| {label} | {what} | " + " | ".join(cells) + " |")
            label = " | "
        cells = [f"{r['rows'][name]['clip']['us_per_tensor_diff']:+.2f} us" for r in results]
        lines.append(f"| {label} | clip, ours - Paddle's, per tensor | " + " | ".join(cells) + " |")
        cells = [f"{r['rows'][name]['added_host_reads_per_step']:+g} / "
                 f"{r['rows'][name]['scaling_off_added_reads']:+g}" for r in results]
        lines.append(f"| {label} | added host reads per step (scaling on / off) | " + " | ".join(cells) + " |")
    cells = [f"{r['hook_us_per_step']:.1f} us" for r in results]
    lines.append("| VisualDLHook | | per logged step (6 tags, flushes included) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(results: List[Dict[str, Any]]) -> List[str]:
    missed = []
    for r in results:
        for name, row in r["rows"].items():
            for key in ("plain", "rehearsal"):
                if row[key]["p25"] > 1.0:
                    missed.append(f"Paddle {r['paddle']} {name} {key}: whole-step ratio {row[key]['ratio']:.3f}")
            if row["clip"]["p25"] > 1.0:
                missed.append(f"Paddle {r['paddle']} {name}: clip ratio {row['clip']['ratio']:.3f}")
            if row["added_host_reads_per_step"] > 0:
                missed.append(f"Paddle {r['paddle']} {name}: {row['added_host_reads_per_step']} added host reads")
        if r["hook_us_per_step"] > 20:
            missed.append(f"Paddle {r['paddle']}: hook {r['hook_us_per_step']:.1f} us per step")
    return missed


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--here", action="store_true", help="only this interpreter's Paddle")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (with --here)")
    parser.add_argument("--only", metavar="MODEL", help="one model of the matrix, e.g. 'mid MLP'")
    args = parser.parse_args(argv)
    if args.here:
        result = measure_here(args.quick, args.only)
        print(json.dumps(result) if args.json else table([result]))
        return 0
    pythons = [os.path.join(ROOT, v, "bin", "python") for v in VENVS]
    pythons = [p for p in pythons if os.path.exists(p)] or [sys.executable]
    results = []
    for python in pythons:
        cmd = [python, os.path.abspath(__file__), "--here", "--json"] + (["--quick"] if args.quick else []) + (
            ["--only", args.only] if args.only else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if proc.returncode != 0:
            print(f"{python}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"Machine: {machine()}\n")
    print(table(results))
    missed = goals(results)
    print("\nGoals (whole step with scaling on and clip <= 1.00 within the spread, hook <= 20 us, 0 added host "
          "reads with scaling on; with scaling off the guard's one read is the price of not applying NaNs): "
          + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
