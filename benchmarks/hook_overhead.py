"""Step time with VisualDLHook logging every step / without it (small MLP on CPU, same run).

Also prints, for comparison, the Paddle image guide's way (``loss.item()`` and two
``LogWriter.add_scalar`` calls a step).

Flushes (one device read and one file write per `flush_every` steps) are inside the timing.

    python benchmarks/hook_overhead.py      # goal: ratio <= 1.02
"""

from __future__ import annotations

import argparse
import tempfile

import paddle
from _timing import interleaved, paired_ratio, report

import paddle_amp_ext as amp

try:
    from visualdl import LogWriter
except ImportError:  # pragma: no cover
    raise SystemExit("needs VisualDL: pip install 'paddle-amp-ext[visualdl]'") from None


def main() -> bool:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=80)
    args = parser.parse_args()
    x, y = paddle.randn([args.batch, args.width]), paddle.randn([args.batch, 1])

    def loop(with_hook, logdir: str):
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(args.width, args.width), paddle.nn.ReLU(),
                                     paddle.nn.Linear(args.width, args.width), paddle.nn.ReLU(),
                                     paddle.nn.Linear(args.width, 1))
        opt = paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters())
        hooks = [amp.VisualDLHook(logdir)] if with_hook is True else []
        scaler = amp.GradScaler(enable=False, hooks=hooks)
        writer = LogWriter(logdir=logdir + "/guide") if with_hook == "guide" else None
        counter = [0]

        def step():
            loss = paddle.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt, grad_clip=1.0)
            scaler.update()
            opt.clear_grad()
            if writer is not None:  # the Paddle image guide's way: two host reads, two add_scalar
                writer.add_scalar("loss", loss.item(), counter[0])
                writer.add_scalar("loss_scale", scaler.loss_scale, counter[0])
                counter[0] += 1

        return step, hooks + ([writer] if writer else [])

    with tempfile.TemporaryDirectory() as tmp:
        logged, hooks = loop(True, tmp)
        plain, _ = loop(False, tmp)
        guide, writers = loop("guide", tmp)
        samples: dict = {}
        times = interleaved({"hook": logged, "plain": plain, "guide": guide}, args.steps, args.repeats, samples=samples)
        hooks[0].close()
        writers[0].close()
    print(f"for comparison, .item() + LogWriter.add_scalar for 2 tags (the image guide's way): "
          f"ratio {paired_ratio(samples, 'guide', 'plain'):.3f}")
    return report("VisualDL hook step time (logging every step / none)", paired_ratio(samples, "hook", "plain"), 1.02,
                  f"{times['hook'] * 1e3:.3f} ms vs {times['plain'] * 1e3:.3f} ms, flush every 50 steps")


if __name__ == "__main__":
    main()
