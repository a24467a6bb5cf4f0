"""fp16 emulation cost: emulated training step / float32 step on a 512-wide MLP on CPU.

    python benchmarks/emulation_cost.py     # goal: ratio <= 1.4
"""

from __future__ import annotations

import argparse

import paddle
from _timing import interleaved, paired_ratio, report

import paddle_amp_ext as amp
from paddle_amp_ext.rehearsal.rounding import cast_is_exact


def main() -> bool:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    x, y = paddle.randn([args.batch, args.width]), paddle.randn([args.batch, 1])

    def build():
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(args.width, args.width), paddle.nn.ReLU(),
                                     paddle.nn.Linear(args.width, args.width), paddle.nn.ReLU(),
                                     paddle.nn.Linear(args.width, 1))
        return model, paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters())

    plain_model, plain_opt = build()
    emu_model, emu_opt = build()

    def plain():  # inside the rehearsal's scope, so with autocast off: nothing of it is rounded
        with amp.auto_cast(enable=False):
            loss = paddle.nn.functional.mse_loss(plain_model(x), y)
        loss.backward()
        plain_opt.step()
        plain_opt.clear_grad()

    def emulated():
        paddle.nn.functional.mse_loss(emu_model(x), y).backward()
        emu_opt.step()
        emu_opt.clear_grad()

    with amp.fp16_emulation(emu_model):
        samples: dict = {}
        times = interleaved({"emulated": emulated, "fp32": plain}, args.steps, args.repeats, warmup=5, samples=samples)
    path = "Paddle's cast" if cast_is_exact("float16") else "exact arithmetic rounding (Paddle's CPU cast truncates)"
    return report("fp16 emulation step time (emulated / float32)", paired_ratio(samples, "emulated", "fp32"), 1.4,
                  f"{times['emulated'] * 1e3:.2f} ms vs {times['fp32'] * 1e3:.2f} ms, {args.width}-wide MLP, "
                  f"batch {args.batch}, rounding via {path}, Paddle {paddle.__version__}")


if __name__ == "__main__":
    main()
