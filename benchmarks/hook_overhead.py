"""Step time with the hook logging every step to each dashboard / without it (small MLP on CPU, same run).

One line per backend (``--report-to``, default every one installed): VisualDL, TensorBoard,
SwanLab (offline) and W&B (its offline run file, written by the package; ``WANDB_MODE=online``
would measure W&B's own ``log()``, and upload), each against the bare step measured back to back. Also
prints, for comparison, the Paddle image guide's way (``loss.item()`` and two VisualDL
``LogWriter.add_scalar`` calls a step) and tensorboardX's ``SummaryWriter.add_scalar`` for the
same six values (with ``.item()``).

Every cost of a step is inside its own variant's timing: a sample is ``--steps`` steps (a
multiple of the hook's ``flush_every``, 200) followed by the hook's ``flush()`` (and the
comparisons' writer flush), so each sample holds its flushes (one device read and one write
per 200 steps) and leaves nothing for the background flusher to write while another variant is
timed. The ratio is the median over repeats of the pair measured back to back, with its
quartiles. SwanLab is run offline with telemetry off; every file goes to a temporary directory.

    python benchmarks/hook_overhead.py                      # goal: ratio <= 1.02 per backend
    python benchmarks/hook_overhead.py --report-to tensorboard
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import paddle  # noqa: E402
from _timing import interleaved, paired_quartiles, paired_ratio, report  # noqa: E402

import paddle_amp_ext as amp  # noqa: E402
from paddle_amp_ext.dashboards import backends  # noqa: E402


def installed() -> list:
    return [b.name for b in backends.BACKENDS if b.module is None or importlib.util.find_spec(b.module)]


def main() -> bool:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200, help="steps per sample (a multiple of flush_every)")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--flush-every", type=int, default=None, help="the hook's flush_every (default: its own)")
    parser.add_argument("--report-to", default=None, help="backends (comma-separated; default every one installed)")
    args = parser.parse_args()
    names = list(backends.parse_report_to(args.report_to)) if args.report_to else installed()
    x, y = paddle.randn([args.batch, args.width]), paddle.randn([args.batch, 1])

    def loop(variant: str, logdir: str):
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(args.width, args.width), paddle.nn.ReLU(),
                                     paddle.nn.Linear(args.width, args.width), paddle.nn.ReLU(),
                                     paddle.nn.Linear(args.width, 1))
        opt = paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters())
        extra = {} if args.flush_every is None else {"flush_every": args.flush_every}
        hooks = [amp.VisualDLHook(logdir, report_to=variant, run_name=variant, **extra)] if variant in names else []
        scaler = amp.GradScaler(enable=False, hooks=hooks)
        writer = None
        if variant == "guide":
            from visualdl import LogWriter

            writer = LogWriter(logdir=os.path.join(logdir, "guide"))
        elif variant == "tensorboardX":
            from tensorboardX import SummaryWriter

            writer = SummaryWriter(logdir=os.path.join(logdir, "tbx"), flush_secs=1)
        counter = [0]

        def sample():
            for _ in range(args.steps):
                step()
            for owner in hooks + ([writer] if writer else []):
                owner.flush()

        def step():
            loss = paddle.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt, grad_clip=1.0)
            scaler.update()
            opt.clear_grad()
            if variant == "guide":  # the Paddle image guide's way: two host reads, two add_scalar
                writer.add_scalar("loss", loss.item(), counter[0])
                writer.add_scalar("loss_scale", scaler.loss_scale, counter[0])
            elif variant == "tensorboardX":  # the six values, read to the host each step
                result = scaler.last_result
                for tag, value in (("amp/loss", loss.item()), ("amp/loss_scale", result.loss_scale),
                                   ("amp/log2_loss_scale", 0.0), ("amp/skipped_steps", 0.0),
                                   ("amp/grad_norm", float(result.grad_norm)), ("amp/lr", opt.get_lr())):
                    writer.add_scalar(tag, value, counter[0])
            counter[0] += 1

        return sample, hooks + ([writer] if writer else [])

    comparisons = [v for v, module in (("guide", "visualdl"), ("tensorboardX", "tensorboardX"))
                   if importlib.util.find_spec(module)]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        variants, closers = {"plain": loop("plain", tmp)[0]}, []
        for name in names + comparisons:
            variants[name], made = loop(name, tmp)
            closers += made
        samples: dict = {}
        times = interleaved(variants, 1, args.repeats, warmup=2, samples=samples)
        for closer in closers:
            closer.close()
    per_step = {name: value / args.steps for name, value in times.items()}
    for name in comparisons:
        print(f"for comparison, {name}: ratio {paired_ratio(samples, name, 'plain'):.3f}")
    for name in names:
        low, high = paired_quartiles(samples, name, "plain")
        ok &= report(f"{name} hook step time (logging every step / none)", paired_ratio(samples, name, "plain"), 1.02,
                     f"quartiles {low:.3f}-{high:.3f}; {per_step[name] * 1e3:.3f} ms vs {per_step['plain'] * 1e3:.3f} "
                     f"ms, flush every {args.flush_every or 200} steps")
    return ok


if __name__ == "__main__":
    main()
