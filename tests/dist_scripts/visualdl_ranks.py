"""Run under `paddle.distributed.launch --nproc_per_node 2`: rank-0-only and per-rank logging."""

import sys

import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp

out = sys.argv[1]
dist.init_parallel_env()
paddle.seed(0)
model = paddle.nn.Linear(4, 1)
dp = paddle.DataParallel(model)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
default = amp.VisualDLHook(f"{out}/default", flush_every=2)
per_rank = amp.VisualDLHook(f"{out}/all", all_ranks=True)
scaler = amp.GradScaler(enable=False, hooks=[default, per_rank])
for _ in range(3):
    scaler.scale(dp(paddle.randn([8, 4])).mean()).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
default.close()
per_rank.close()
assert default.active is False
