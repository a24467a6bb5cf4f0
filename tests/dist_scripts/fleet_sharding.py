"""Sharding stage 1 (2 ranks) or dp x sharding (4 ranks) under fleet; argv: OUT_DIR DP SHARDING.

Scenarios (one launch): NaN on rank 1 at step 1 with loss scaling off and on (also through
``fleet.distributed_scaler``); ``step(grad_clip=1.0)`` against Paddle's own clipped path; with
2 ranks also stage 3's contract (``GroupShardedScaler``, the optimizer's ``_optim``/``_group``).
"""

import sys

import fleet_common as fc
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import GroupShardedScaler

import paddle_amp_ext as amp

out_dir, dp, sharding = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hcg = fc.init(dp=dp, sharding=sharding)
rank = dist.get_rank()
NAN_RANK = 1


def run(scaler=None, nan=False, grad_clip=None, optimizer_clip=None, emulate=False, distributed_scaler=False,
        subset=False):
    """``subset``: clip the first layer only (ours: step(parameters=...); Paddle's: need_clip=False)."""
    model = fc.mlp()
    for p in model[2].parameters() if subset and scaler is None else ():
        p.need_clip = False
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters(), grad_clip=optimizer_clip)
    wrapped = fleet.distributed_model(model)
    opt = fleet.distributed_optimizer(opt)
    if distributed_scaler:
        scaler = fleet.distributed_scaler(scaler)

    def forward(step):
        return (wrapped(fc.batch(step, rank)) * 10).pow(2).mean()

    return fc.train(model, opt, forward, scaler=scaler, nan_at=1 if nan and rank == NAN_RANK else None,
                    grad_clip=grad_clip, emulate=emulate,
                    parameters=list(model[0].parameters()) if subset and scaler is not None else None)


def paddle_scaled_clip() -> list:
    """The collectives of Paddle's own loss-scaled, clipped step: ``paddle.amp.GradScaler`` through
    ``fleet.distributed_scaler`` (its ``_unscale`` all-reduces found_inf) and ``scaler.step``
    (``_unscale``, then ``optimizer.step()`` with fleet's clip). Paddle's scaler is off on a CPU:
    its state is built and it is switched on by hand (test setup); 3 steps, no NaN."""
    from paddle_amp_ext import _compat

    model = fc.mlp()
    opt = fleet.distributed_optimizer(paddle.optimizer.SGD(
        learning_rate=0.1, parameters=model.parameters(), grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0)))
    wrapped = fleet.distributed_model(model)
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
    _compat.init_scaler_state(scaler, 1024.0)
    scaler._enable = True
    scaler._incr_ratio, scaler._decr_ratio, scaler._incr_every_n_steps, scaler._decr_every_n_nan_or_inf = 2.0, 0.5, 2000, 1
    scaler = fleet.distributed_scaler(scaler)
    counts = []
    for step in range(3):
        ((wrapped(fc.batch(step, rank)) * 10).pow(2).mean() * 1024.0).backward()
        counts.append(fc.counting_collectives(scaler.step, opt)[1])
        scaler.update()
        opt.clear_grad()
    return counts


record = {
    "paddle_scaled_clip": {"collectives": paddle_scaled_clip()},
    "nan_off": run(amp.GradScaler(enable=False), nan=True),
    "nan_on": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True),
    "nan_on_fleet_scaler": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True,
                               distributed_scaler=True),
    # loss scaling on with a global-norm clip: decided by the reduced norm of the unscaled gradients
    "nan_on_clip": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True, grad_clip=1.0),
    "nan_on_fleet_scaler_clip": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True,
                                    grad_clip=1.0, distributed_scaler=True),
    "nan_on_own_clip": run(amp.GradScaler(init_loss_scaling=1024.0), nan=True, emulate=True,
                           optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
    "paddle_clip": run(optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
    "ours_clip": run(amp.GradScaler(enable=False), grad_clip=1.0),
    "nan_clip_off": run(amp.GradScaler(enable=False), nan=True, grad_clip=1.0),  # decided by the reduced norm
    "nan_own_clip_off": run(amp.GradScaler(enable=False), nan=True, optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
    "ours_record": run(amp.GradScaler(enable=False), optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0)),
    "paddle_clip_subset": run(optimizer_clip=paddle.nn.ClipGradByGlobalNorm(1.0), subset=True),
    "ours_clip_subset": run(amp.GradScaler(enable=False), grad_clip=1.0, subset=True),
}


def stage3():
    """Stage 3's optimizer as ``group_sharded_parallel(level="p_g_os")`` leaves it (its
    ``_optim``, ``_group``, ``offload``, ``update_slice``), its scaler from Paddle's own
    ``GroupShardedScaler``: a rank's slice (its own values) plus one unsliced parameter."""
    paddle.seed(10 + rank)
    sliced = paddle.nn.Linear(4, 3)
    paddle.seed(0)
    whole = paddle.nn.Linear(4, 1)
    for p in whole.parameters():
        p.unslice = True
    params = list(sliced.parameters()) + list(whole.parameters())
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=params)
    opt._optim, opt._group, opt.offload = opt, hcg.get_sharding_parallel_group(), False
    opt.update_slice = lambda: None

    def forward(step):
        x = fc.batch(step, 0)
        return (sliced(x) * 10).pow(2).mean() + (whole(x) * 10).pow(2).mean()

    model = paddle.nn.LayerList([sliced, whole])
    clip = fc.train(model, opt, forward, scaler=amp.GradScaler(enable=False), grad_clip=1.0)
    scaler = GroupShardedScaler(amp.GradScaler(init_loss_scaling=1024.0))
    nan = fc.train(model, opt, forward, scaler=scaler, nan_at=1 if rank == NAN_RANK else None, emulate=True)
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):  # unscale_() by hand, then step()
        scaler.scale(forward(3)).backward()
        scaler.unscale_(opt)
        by_hand = {"grads": fc.grads(model), "params0": fc.params(model)}
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
    by_hand["params"] = fc.params(model)
    return {"clip": clip, "nan_on": nan, "unscale_then_step": by_hand}


if dp == 1:
    record["stage3"] = stage3()
fc.dump(out_dir, record)
