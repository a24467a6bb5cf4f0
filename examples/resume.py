"""Checkpoint model, optimizer and scaler; kill; resume with the identical loss-scale trajectory.

    python examples/resume.py --ckpt ckpt --steps 30 --kill-at 12   # dies at step 12
    python examples/resume.py --ckpt ckpt --steps 30                # resumes at step 13
"""

import argparse
import json
import os
import signal

import paddle

import paddle_amp_ext as amp

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", default="checkpoints/resume")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this process after saving this step")
parser.add_argument("--overflow-at", default="5,17", help="steps whose loss is made inf (to see the scaler react)")
parser.add_argument("--trace", default=None, help="append one JSON line per step: step, loss_scale, skipped")
args = parser.parse_args()
overflow_at = {int(s) for s in args.overflow_at.split(",") if s}

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
scaler = amp.GradScaler(init_loss_scaling=2**10, incr_every_n_steps=4)
start = 0
state_path = os.path.join(args.ckpt, "state.pdckpt")
if os.path.exists(state_path):
    state = paddle.load(state_path)
    model.set_state_dict(state["model"])
    optimizer.set_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    start = state["step"] + 1
    print(f"resumed at step {start} with loss scale {scaler.loss_scale:g}")

with amp.fp16_emulation(model):  # a no-op for the numbers on a GPU run; makes the scaler run on a CPU
    for step in range(start, args.steps):
        paddle.seed(1000 + step)  # the data of a step does not depend on where we resumed
        x = paddle.randn([16, 8])
        with amp.auto_cast(dtype="auto"):
            loss = (model(x) - x.sum(axis=1, keepdim=True)).pow(2).mean()
        if step in overflow_at:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        result = scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        if args.trace:
            with open(args.trace, "a") as f:
                f.write(json.dumps({"step": step, "loss_scale": result.loss_scale, "skipped": result.skipped}) + "\n")
        os.makedirs(args.ckpt, exist_ok=True)
        paddle.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scaler": scaler.state_dict(), "step": step}, state_path + ".tmp")
        os.replace(state_path + ".tmp", state_path)  # a kill never leaves half a checkpoint
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
print(f"done: {args.steps} steps, skipped={scaler.skipped_steps}, loss scale {scaler.loss_scale:g}")
