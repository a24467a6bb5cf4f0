"""Step time: paddle_amp_ext scale/backward/step(grad_clip)/update vs Paddle's own GradScaler with
ClipGradByGlobalNorm on the optimizer. Both scalers run the real machinery (on a CPU inside
fp16 emulation with matmul black-listed, so nothing is quantized and only the scaler differs).

    python benchmarks/step_time.py          # goal: ratio <= 1.02
"""

from __future__ import annotations

import argparse

import paddle
from _timing import interleaved, paired_ratio, report

import paddle_amp_ext as amp
from paddle_amp_ext import _compat


def build(width: int, clip_in_optimizer: bool):
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(width, width), paddle.nn.ReLU(), paddle.nn.Linear(width, width),
                                 paddle.nn.ReLU(), paddle.nn.Linear(width, 1))
    clip = paddle.nn.ClipGradByGlobalNorm(1.0) if clip_in_optimizer else None
    return model, paddle.optimizer.Adam(learning_rate=1e-4, parameters=model.parameters(), grad_clip=clip)


def main() -> bool:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    x = paddle.randn([args.batch, args.width])
    y = paddle.randn([args.batch, 1])

    ours_model, ours_opt = build(args.width, clip_in_optimizer=False)
    ours = amp.GradScaler(init_loss_scaling=2.0**10)
    theirs_model, theirs_opt = build(args.width, clip_in_optimizer=True)
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
    with amp.fp16_emulation(both, custom_black_list=["matmul"]):
        samples: dict = {}
        times = interleaved({"paddle_amp_ext": ours_step, "paddle.amp": theirs_step}, args.steps, args.repeats, samples=samples)
    assert ours.is_enable() and theirs.is_enable()
    return report("GradScaler step time (ext / paddle.amp + ClipGradByGlobalNorm)",
                  paired_ratio(samples, "paddle_amp_ext", "paddle.amp"), 1.02,
                  f"{times['paddle_amp_ext'] * 1e3:.3f} ms vs {times['paddle.amp'] * 1e3:.3f} ms, "
                  f"MLP {args.width} wide, batch {args.batch}, Paddle {paddle.__version__}")


if __name__ == "__main__":
    main()
