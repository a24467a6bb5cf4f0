"""Run under `paddle.distributed.launch --nproc_per_node 2`: the rehearsal's kernels on DistTensors.

argv: OUT_DIR. Writes OUT_DIR/rank{N}.json:

- ``finite``: ``_compat.kernels.all_finite`` of ``Shard(1)``/``Shard(0)``/``Replicate``/``Partial``
  DistTensors, finite and with a NaN in rank 1's own piece only (every rank must answer for the
  global value: a fix-up the answer decides runs collectives);
- ``rounded``: ``round_to_float16`` of the same tensors (new and in place): equal to numpy's
  float16 rounding of the global value, placements kept (a ``Partial`` one reduced first);
- ``grads``: the gradients (global values) of a column-sharded first Linear (``Shard(1)``
  weight, ``dist.shard_layer``) under ``fp16_emulation`` with nothing black-listed, of the same
  dense model under ``fp16_emulation`` and of Paddle's float32 path.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp
from paddle_amp_ext._compat import kernels

out_dir = sys.argv[1]
rank = dist.get_rank()
MESH = dist.ProcessMesh([0, 1], dim_names=["x"])
BASE = (np.arange(32, dtype=np.float32).reshape(4, 8) - 15.5) * np.float32(0.3171)  # not float16 values


def tensors(nan_on_rank_1: bool) -> dict:
    """Name -> DistTensor of global value BASE (a NaN in rank 1's own piece where asked)."""
    out = {}
    placements = (("S1", dist.Shard(1)), ("S0", dist.Shard(0)))
    if not nan_on_rank_1:  # a Replicate tensor is the same on every rank: no piece of rank 1's own
        placements += (("R", dist.Replicate()),)
    for name, placement in placements:
        value = BASE.copy()
        if nan_on_rank_1:  # in rank 1's shard: columns 4.. (S1), rows 2.. (S0)
            value[3, 7] = np.nan
        out[name] = dist.shard_tensor(paddle.to_tensor(value), MESH, [placement])
    left = dist.shard_tensor(paddle.to_tensor(BASE), MESH, [dist.Shard(1)])
    eye = np.eye(8, dtype=np.float32)
    if nan_on_rank_1:
        eye[7, 7] = np.nan  # rank 1's rows: its addend holds the NaN
    out["P"] = paddle.matmul(left, dist.shard_tensor(paddle.to_tensor(eye), MESH, [dist.Shard(0)]))  # Partial
    return out


def kind(tensor) -> str:
    """The placements as letters (2.6.2 lists a resharded Replicate tensor's as [])."""
    return "".join("P" if p.is_partial() else "R" if p.is_replicated() else f"S{p.get_dim()}"
                   for p in tensor.placements) or "R"


def main() -> None:
    record: dict = {"finite": {}, "rounded": {}}
    for nan in (False, True):
        for name, tensor in tensors(nan).items():
            record["finite"][f"{name}{'_nan' if nan else ''}"] = [kind(tensor), kernels.all_finite(tensor)]
    expected = BASE.astype(np.float16).astype(np.float32)
    for in_place in (False, True):
        for name, tensor in tensors(False).items():
            out = kernels.round_to_float16(tensor, in_place=in_place)
            record["rounded"][f"{name}{'_in_place' if in_place else ''}"] = [
                kind(out), bool(np.array_equal(out.numpy(), expected))]
    record["grads"] = grads()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(record, f)


def mlp() -> paddle.nn.Layer:
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 2))


def column_sharded(name, layer, mesh) -> None:
    if name == "0":
        layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(1)])
        layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Shard(0)])


def grads() -> dict:
    x = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    out = {}
    for name, emulate, sharded in (("float32", False, True), ("emulated", True, True), ("dense_emulated", True, False)):
        model = mlp()
        inputs = paddle.to_tensor(x)
        if sharded:
            model = dist.shard_layer(model, MESH, column_sharded)
            inputs = dist.shard_tensor(inputs, MESH, [dist.Replicate()])
        if emulate:
            with amp.fp16_emulation(model):
                model(inputs).pow(2).mean().backward()
        else:
            model(inputs).pow(2).mean().backward()
        out[name] = [np.asarray(p.grad.numpy()).ravel().tolist() for p in model.parameters()]
        out[f"{name}_placements"] = [kind(p.grad) if p.grad.is_dist() else "dense" for p in model.parameters()]
    return out


main()
