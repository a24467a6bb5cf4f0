"""Data-parallel AMP training: every rank skips the same steps, with no collective of the package's
(after backward every rank holds the same all-reduced gradients, so the same found_inf).

Needs the [examples] extra (tqdm).

    python -m paddle.distributed.launch --nproc_per_node 2 examples/train_distributed.py
    (on a CPU: unset CUDA_VISIBLE_DEVICES first; add --emulate to run the scaler for real)
"""

import argparse
import contextlib

import paddle
import paddle.distributed as dist
from tqdm import tqdm

import paddle_amp_ext as amp

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--logdir", default="runs/distributed")
parser.add_argument("--emulate", action="store_true")
args = parser.parse_args()

dist.init_parallel_env()
rank = dist.get_rank()
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
dp_model = paddle.DataParallel(model)
optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
hook = amp.VisualDLHook(args.logdir, flush_every=10)  # rank 0 writes; other ranks do nothing
scaler = amp.GradScaler(init_loss_scaling=2**12, hooks=[hook])
paddle.seed(100 + rank)  # each rank its own data
emulation = amp.fp16_emulation(model) if args.emulate else contextlib.nullcontext()
with hook, emulation:
    for _ in tqdm(range(args.steps), disable=rank != 0):
        x = paddle.randn([32, 16])
        with amp.auto_cast(dtype="auto"):
            loss = (dp_model(x) - x.sum(axis=1, keepdim=True)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer, grad_clip=1.0)
        scaler.update()
        optimizer.clear_grad()
checksum = float(sum(p.abs().sum() for p in model.parameters()))
print(f"rank {rank}: skipped={scaler.skipped_steps} scale={scaler.loss_scale:g} checksum={checksum:.6f}")
