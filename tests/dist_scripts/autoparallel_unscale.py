"""Run under `paddle.distributed.launch --nproc_per_node 2`: the package's DistTensor unscale on a CPU.

argv: OUT_DIR. Gradients on a 2-rank mesh: a ``Shard(0)`` one (an inf or NaN only in rank 1's
shard, in the cases that have one), a ``Replicate`` one and a ``Partial`` one (rank 1's addend NaN
in ``partial_nan``), divided by a scale of 4 (and of 3). Writes OUT_DIR/rank{N}.json: per case
the flag's placements before it is read, the agreed flag (host bool), and each gradient's local
value and placements after the unscale.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

from paddle_amp_ext._compat import autoparallel as ap
from paddle_amp_ext.distributed import agree_found_inf, host_bool

out_dir = sys.argv[1]
rank = dist.get_rank()
MESH = dist.ProcessMesh([0, 1], dim_names=["x"])
INF, NAN = float("inf"), float("nan")


def kind(placement) -> str:
    return "shard" if placement.is_shard() else "partial" if placement.is_partial() else "replicate"


def case(name: str, scale: float) -> dict:
    shard_global = [1.0, 2.0, INF if name == "shard_inf_rank1" else 12.0, 8.0]
    addend = [1.0, 2.0] if rank == 0 else [NAN if name == "partial_nan" else 3.0, 5.0]
    grads = [dist.shard_tensor(paddle.to_tensor(shard_global), MESH, [dist.Shard(0)]),
             dist.shard_tensor(paddle.to_tensor([4.0, 8.0]), MESH, [dist.Replicate()]),
             ap.from_local(paddle.to_tensor(addend), MESH, [dist.Partial()])]
    found = ap.check_finite_and_unscale_(grads, paddle.to_tensor([scale]))
    return {"flag_placements": [kind(p) for p in found.placements],
            "found": host_bool(agree_found_inf(found)),
            "grads": [np.asarray(g._local_value().numpy()).tolist() for g in grads],
            "placements": [[kind(p) for p in g.placements] for g in grads]}


record = {name: case(name, 4.0) for name in ("all_finite", "shard_inf_rank1", "partial_nan")}
record["scale3"] = case("all_finite", 3.0)
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(record, f)
print(f"rank {rank} done", flush=True)
os._exit(0)  # 3.3.1 auto-parallel workers once aborted at interpreter exit (docs/guides/auto-parallel.md)
