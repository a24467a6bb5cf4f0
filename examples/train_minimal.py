"""The Paddle image guide's AMP loop, with the gate, grad clip in scaler.step and VisualDL.

    python examples/train_minimal.py --steps 200      # on a CPU add --emulate (fp16 dry run)
    python -m paddle_amp_ext.visualdl_serve --logdir runs
"""

import argparse
import contextlib

import paddle
from tqdm import tqdm

import paddle_amp_ext as amp

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--logdir", default="runs/minimal")
parser.add_argument("--emulate", action="store_true", help="fp16 emulation: the scaler runs on a CPU")
args = parser.parse_args()

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(32, 64), paddle.nn.ReLU(), paddle.nn.Linear(64, 10))
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
loss_fn = paddle.nn.CrossEntropyLoss()
decision = amp.device.current_decision("auto")  # fp16 on CC 7.x, bf16 on >= 8.0, else float32
print(f"AMP: {decision.dtype} ({decision.reason})")

hook = amp.VisualDLHook(args.logdir, flush_every=20)
scaler = amp.GradScaler(init_loss_scaling=2**14, hooks=[hook])
emulation = amp.fp16_emulation(model) if args.emulate else contextlib.nullcontext()
with hook, emulation:
    for step in (bar := tqdm(range(args.steps), desc="train")):
        data = paddle.randn([64, 32])
        label = (data[:, :10].argmax(axis=1)).unsqueeze(1)
        with amp.auto_cast(dtype="auto"):
            output = model(data)
            loss = loss_fn(output, label)
        scaler.scale(loss).backward()
        result = scaler.step(optimizer, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
        scaler.update()
        optimizer.clear_grad()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", scale=scaler.loss_scale, skipped=scaler.skipped_steps)
print(f"steps={args.steps} skipped={scaler.skipped_steps} final_scale={scaler.loss_scale:g} logdir={args.logdir}")
