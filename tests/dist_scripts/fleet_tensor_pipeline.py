"""Tensor parallel (mp_degree=2) or pipeline parallel (pp_degree=2) under fleet; argv: OUT_DIR MODE.

Tensor parallel: each rank holds its own shard (parameters marked ``is_distributed``, as
fleet's parallel layers mark theirs) plus replicated parameters whose gradients agree across
ranks. Pipeline: each rank holds its own stage and steps through Paddle's own
``PipelineParallel._optimizer_step`` (what ``train_batch(..., scaler=)`` calls after the
micro-batches). Scenarios (one launch): Paddle's clipped path, ``step(grad_clip=1.0)``, the
optimizer's own clip with the norm recorded, NaN on rank 1 with loss scaling off and on.
"""

import sys
from types import SimpleNamespace

import fleet_common as fc
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel import PipelineParallel

import paddle_amp_ext as amp

out_dir, mode = sys.argv[1], sys.argv[2]
fc.init(**{mode: 2})
rank = dist.get_rank()


def build():
    paddle.seed(10 + rank)
    own = paddle.nn.Linear(4, 3)  # a tensor-parallel shard, or this rank's pipeline stage
    paddle.seed(0)
    shared = paddle.nn.Linear(4, 1)
    if mode == "mp":
        for p in own.parameters():
            p.is_distributed = True
    return paddle.nn.LayerList([own, shared])


def run(scaler=None, nan=False, grad_clip=None, optimizer_clip=None, emulate=False, distributed_scaler=False):
    model = build()
    own, shared = model
    opt = fleet.distributed_optimizer(
        paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters(), grad_clip=optimizer_clip))
    if distributed_scaler:
        scaler = fleet.distributed_scaler(scaler)

    def forward(step):
        x = fc.batch(step, 0)  # the replicated part sees the same data on every rank
        loss = (own(x) * 10).pow(2).mean()
        return loss + (shared(x) * 10).pow(2).mean() if mode == "mp" or rank == 1 else loss

    pipe = SimpleNamespace(_delay_scale_loss=False, _release_gradients=False, scaler=scaler, optimizer=opt,
                           lr_scheduler=None)  # what PipelineParallel._optimizer_step reads
    step = (lambda: PipelineParallel._optimizer_step(pipe)) if mode == "pp" else None
    return fc.train(model, opt, forward, scaler=scaler, nan_at=1 if nan and rank == 1 else None,
                    grad_clip=grad_clip, emulate=emulate, optimizer_step=step)


record = {
    "paddle_clip": run(optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
    "ours_record": run(amp.GradScaler(enable=False), optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
    "nan_off": run(amp.GradScaler(enable=False), nan=True),
    "nan_on": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True),
    "nan_on_fleet_scaler": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True,
                               distributed_scaler=True),
}
if mode == "mp":  # the pipeline's step comes from train_batch, which passes no grad_clip
    record["ours_clip"] = run(amp.GradScaler(enable=False), grad_clip=1.0)
fc.dump(out_dir, record)
