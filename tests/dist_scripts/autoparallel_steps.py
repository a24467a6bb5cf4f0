"""Run under `paddle.distributed.launch --nproc_per_node 2`: auto-parallel (DistTensor) training steps.

argv: OUT_DIR INIT (1: ``dist.init_parallel_env()`` first, a default process group as fleet-based
scripts and AutoTrainer have; 0: none). For every layout (``mp``: a column/row-sharded MLP built
by ``dist.shard_layer``; ``dp``: replicated parameters, ``Shard(0)`` data, ``Partial`` gradients;
``plan``: ``dist.parallelize`` with ColWise/RowWise plans, 3.x only), with the optimizer wrapped
by ``dist.shard_optimizer``:

- ``paddle``: Paddle's own path, ``ClipGradByGlobalNorm(CLIP)`` on the optimizer, plain
  ``loss.backward(); opt.step()``, on the batches of the steps the others apply (0 and 2);
- ``ours``: the package's ``GradScaler`` (loss scaling off, as on every CPU) with
  ``step(grad_clip=CLIP)`` and a VisualDL hook (rank 0 writes), NaN loss at step 1 on rank 1 only;
- ``own_clip``: the same scaler without ``grad_clip=``, the optimizer's own ``ClipGradByGlobalNorm``;
- ``shard_scaler`` (3.x): the ``ours`` scaler wrapped by ``dist.shard_scaler``;
- ``emulate``: loss scaling on, inside ``fp16_emulation``; ``emulate_shard_scaler`` (3.x): the
  same scaler wrapped by ``dist.shard_scaler``;
- ``guard``: ``guard_optimizer`` on a plain loop (optimizer clip), the same NaN.

Writes OUT_DIR/rank{N}.json: per layout and variant the skips, the norms (host floats), the final
parameters (global values) and the relative error against ``paddle``; the hooks' log dirs.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp

CLIP = 0.05
out_dir, init = sys.argv[1], sys.argv[2] == "1"
if init:
    dist.init_parallel_env()
rank = dist.get_rank()
V3 = hasattr(dist, "shard_scaler")
MESH = dist.ProcessMesh([0, 1], dim_names=["mp"] if V3 else ["x"])


def mlp() -> paddle.nn.Layer:
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))


def shard_mp(name, layer, mesh):
    """Column-sharded first Linear, row-sharded second (2.6.2's matmul grad SPMD rule refuses
    a row-sharded weight with a replicated input gradient: replicated there)."""
    if name == "0":
        layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(1)])
        layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Shard(0)])
    elif name == "2":
        layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(0) if V3 else dist.Replicate()])


def batch(step: int, layout: str):
    x = np.random.default_rng(step).standard_normal((4, 4)).astype("float32")
    return dist.shard_tensor(paddle.to_tensor(x), MESH, [dist.Shard(0) if layout == "dp" else dist.Replicate()])


def build(layout: str, optimizer_clip=None):
    model = mlp()
    opt_params = None
    if layout == "plan":
        opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters(), grad_clip=optimizer_clip)
        plan = {"0": dist.ColWiseParallel(), "2": dist.RowWiseParallel()}
        model, opt = dist.parallelize(model, opt, mesh=MESH, config={"mp_config": {"parallelize_plan": plan}})
        return model, opt
    model = dist.shard_layer(model, MESH, shard_mp if layout == "mp" else None)
    opt_params = model.parameters()
    opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=opt_params, grad_clip=optimizer_clip)
    return model, dist.shard_optimizer(opt)


def loss_of(model, step: int, layout: str, nan: bool):
    """The step's loss; with ``nan`` at step 1, rank 1's own piece of the first layer's output is
    NaN (its shard under mp and the plans, its half of the batch under dp): every rank runs the
    same ops, and a value only a Replicate placement claims is the same on every rank stays so."""
    first = next(layer for layer in model.sublayers() if isinstance(layer, paddle.nn.Linear))
    handle = None
    if nan and step == 1:
        factor = dist.shard_tensor(paddle.to_tensor(float("nan") if rank == 1 else 1.0), MESH, [dist.Replicate()])
        handle = first.register_forward_post_hook(lambda layer, inputs, out: out * factor)
    loss = model(batch(step, layout)).pow(2).mean()
    if handle is not None:
        handle.remove()
    return loss


def host(tensor) -> float | None:
    if tensor is None:
        return None
    if tensor.is_dist():
        tensor = tensor._local_value()
    return float(np.asarray(tensor.numpy()).reshape(-1)[0])


def params(model) -> list:
    return [np.asarray(p.numpy()).ravel().tolist() for p in model.parameters()]


def progress(layout: str, name: str) -> None:
    print(f"rank {rank} {layout} {name} done", flush=True)  # where a crash happened, in the worker's log


def run_paddle(layout: str) -> dict:
    model, opt = build(layout, paddle.nn.ClipGradByGlobalNorm(CLIP))
    for step in (0, 2):
        loss_of(model, step, layout, nan=False).backward()
        opt.step()
        opt.clear_grad()
    progress(layout, "paddle")
    return {"params": params(model)}


def run_ours(layout: str, variant: str) -> dict:
    own_clip = variant == "own_clip"  # the optimizer's own clip: the skip rides on its norm
    model, opt = build(layout, paddle.nn.ClipGradByGlobalNorm(CLIP) if own_clip else None)
    hook = amp.VisualDLHook(f"{out_dir}/vdl/{layout}-{variant}", run_name="", flush_every=1)
    scaler = amp.GradScaler(enable=False, hooks=[hook])
    if variant == "shard_scaler":
        scaler = dist.shard_scaler(scaler)
    rec: dict = {"skipped": [], "norms": [], "losses": []}
    for step in range(3):
        loss = loss_of(model, step, layout, nan=True)
        rec["losses"].append(host(loss))  # this rank's own (local) value
        scaler.scale(loss).backward()
        result = scaler.step(opt, grad_clip=None if own_clip else CLIP)
        scaler.update()
        opt.clear_grad()
        rec["skipped"].append(result.skipped)
        rec["norms"].append(host(result.grad_norm))
    hook.close()
    rec["params"], rec["logdir"] = params(model), hook.logdir
    progress(layout, variant)
    return rec


def run_emulated(layout: str, variant: str) -> dict:
    """Loss scaling on (inside fp16_emulation): the package unscales DistTensor gradients itself
    (``emulate``), or ``dist.shard_scaler``'s ``_unscale`` does (``emulate_shard_scaler``, 3.x)."""
    model, opt = build(layout)
    scaler = amp.GradScaler(init_loss_scaling=1024.0)
    if variant == "emulate_shard_scaler":
        scaler = dist.shard_scaler(scaler)
    rec: dict = {"skipped": [], "norms": [], "scales": [], "unscaled_exactly": [], "finite": [], "nonfinite": []}
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        for step in range(3):
            scaler.scale(loss_of(model, step, layout, nan=True)).backward()
            before = [np.asarray(p._grad_ivar().numpy()) for p in model.parameters()]  # global values, every rank
            scaler.unscale_(opt)
            after = [np.asarray(p._grad_ivar().numpy()) for p in model.parameters()]
            # every finite value divided exactly by the scale, inf kept (inf / scale), NaN where NaN was
            rec["unscaled_exactly"].append(all(np.array_equal(a, b / np.float32(scaler.loss_scale), equal_nan=True)
                                               for a, b in zip(after, before)))
            # the scaled gradients' finite nonzero and non-finite values: what the check above covered
            rec["finite"].append(int(sum(np.count_nonzero(np.isfinite(b) & (b != 0)) for b in before)))
            rec["nonfinite"].append(int(sum(np.count_nonzero(~np.isfinite(b)) for b in before)))
            result = scaler.step(opt, grad_clip=CLIP)
            scaler.update()
            opt.clear_grad()
            rec["skipped"].append(result.skipped)
            rec["norms"].append(host(result.grad_norm))
            rec["scales"].append(scaler.loss_scale)
    rec["params"] = params(model)
    progress(layout, variant)
    return rec


def run_guard(layout: str) -> dict:
    model, opt = build(layout, paddle.nn.ClipGradByGlobalNorm(CLIP))
    rec: dict = {"skipped": [], "norms": []}
    with amp.guard_optimizer(opt) as guard:
        for step in range(3):
            guard.record_loss(loss_of(model, step, layout, nan=True)).backward()
            opt.step()
            opt.clear_grad()
            rec["skipped"].append(guard.last_step_skipped)
            rec["norms"].append(host(guard.last_result.grad_norm))
    rec["params"] = params(model)
    progress(layout, "guard")
    return rec


def rel_error(ours: list, ref: list) -> float:
    a, b = np.concatenate([np.ravel(p) for p in ours]), np.concatenate([np.ravel(p) for p in ref])
    return float(np.abs(a - b).max() / np.abs(b).max())


record: dict = {"init": init, "v3": V3}
layouts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["mp", "dp", "plan"] if V3 else ["mp", "dp"]
for layout in layouts:
    emulated = run_emulated(layout, "emulate")
    ref = run_paddle(layout)
    variants = {"ours": run_ours(layout, "ours"), "own_clip": run_ours(layout, "own_clip"), "guard": run_guard(layout),
                "emulate": emulated}
    if V3:
        variants["shard_scaler"] = run_ours(layout, "shard_scaler")
        variants["emulate_shard_scaler"] = run_emulated(layout, "emulate_shard_scaler")
    for name, rec in variants.items():
        rec["rel"] = rel_error(rec["params"], (variants["emulate"] if name == "emulate_shard_scaler" else ref)["params"])
        print(f"rank {rank} {layout} {name}: skipped {rec['skipped']} rel error vs Paddle {rec['rel']:.3g}",
              flush=True)
    record[layout] = variants
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(record, f)
