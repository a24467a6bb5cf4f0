"""Paddle's documented AMP loop, with nothing of paddle_amp_ext in it: a script nobody wants to edit.

    python examples/plain_paddle_amp.py                          # plain paddle.amp
    python -m paddle_amp_ext.run examples/plain_paddle_amp.py    # the same file, routed: guard, hooks, summary
"""

import argparse

import paddle

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--nan-at", type=int, default=5, help="a step whose loss is NaN (a bad batch)")
args = parser.parse_args()

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
x, y = paddle.randn([64, 16]), paddle.randn([64, 1])
for step in range(args.steps):
    with paddle.amp.auto_cast():
        loss = paddle.nn.functional.mse_loss(model(x), y)
    if step == args.nan_at:
        loss = loss * float("nan")
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
finite = all(bool(paddle.isfinite(p).all()) for p in model.parameters())
print(f"{args.steps} steps, weights finite: {finite}")
