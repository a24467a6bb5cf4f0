"""Run under `paddle.distributed.launch --nproc_per_node 2`: every op the rehearsal rounds, on DistTensors.

argv: OUT_DIR. Writes OUT_DIR/rank{N}.json: per dtype, per local size (``local6144``: inputs of
128 rows sharded by rows, 6144 elements on each rank; ``local3072``: 64 rows, 3072 on each rank,
6144 in all), per op (tests/backward_samples.py), either ``"paddle"`` (Paddle's own float32
op fails on these DistTensors: :data:`UNSUPPORTED`) or:

- ``error``: the largest difference of the rehearsed gradients (global values) from Paddle's
  float32 ones (the same DistTensors, the same seed: the same dropout mask), in units of the rounding (2**-11, 2**-8) times the largest float32 gradient;
- ``saved``: whether the op's backward reads its output (:func:`saved_by_backward` of the
  float32 DistTensor output);
- ``in_place``: how many outputs were rounded in their own buffer; ``local``: the (first) output's
  local element count (an op whose SPMD rule replicates it: all of them);
- ``kernels``: per dtype, whether the one-pass kernel rounds in place here, and whether Paddle's
  cast is exact (then tensors below 4096 elements, a DistTensor's local value's, take the cast).
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys

import numpy as np
import paddle
import paddle.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # tests/

from backward_samples import COLS, SAMPLES, make_inputs, outputs  # noqa: E402

import paddle_amp_ext as amp  # noqa: E402
from paddle_amp_ext._compat import autoparallel, backward, kernels, opdefs  # noqa: E402
from paddle_amp_ext.rehearsal import ops, rounding  # noqa: E402

logging.getLogger("paddle_amp_ext").setLevel(logging.ERROR)
out_dir = sys.argv[1]
MESH = dist.ProcessMesh([0, 1], dim_names=["x"])
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
WHITE = sorted({t for name, types, _ in (*ops.FUNCTIONS, *ops.METHODS) if name in SAMPLES for t in types}
               & opdefs.ops_paddle_defines())
ROWS_SHARDED = {"x", "y", "positive", "label"}  # the others (weight, gamma, beta) replicated
#: ops Paddle's own float32 forward cannot run on these DistTensors, not tried: some take the
#: process down (2.6.2's batch_norm: a segfault in TensorDistAttr's copy; 3.3.1's einsum raises,
#: and 1 run in 3 aborts in converting that error: "std::bad_alloc" in ThrowExceptionToPython)
UNSUPPORTED = ({"batch_norm", "conv1d", "conv2d", "einsum", "__rmatmul__"} if paddle.__version__.startswith("2.")
               else {"einsum"})
calls: list = []
_apply = rounding._RoundTripInPlace.apply
rounding._RoundTripInPlace.apply = lambda x, d: calls.append(1) or _apply(x, d)


def place(name: str, tensor: paddle.Tensor) -> paddle.Tensor:
    return dist.shard_tensor(tensor, MESH, [dist.Shard(0) if name in ROWS_SHARDED else dist.Replicate()])


def cotangents(outs: list) -> list:
    rng = np.random.default_rng(1)
    return [paddle.to_tensor(rng.standard_normal(out.shape).astype(np.float32)) for out in outs]


def run(name: str, rows: int, dtype: str | None):
    """The gradients (global values) of sum(out * cotangent), whether the backward reads an output."""
    inputs = make_inputs(place=place, rows=rows)
    paddle.seed(0)
    if dtype is None:
        outs = outputs(SAMPLES[name](inputs))
    else:
        with amp.rehearse(dtype, custom_white_list=WHITE):
            outs = outputs(SAMPLES[name](inputs))
    saved = any(backward.saved_by_backward(out) for out in outs)
    local = math.prod(autoparallel.local_value(outs[0]).shape)
    live = [(out, c) for out, c in zip(outs, cotangents(outs)) if not out.stop_gradient]
    loss = None
    for out, c in live:
        term = (out * dist.shard_tensor(c, MESH, [dist.Replicate()])).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    grads = {}
    for key, tensor in inputs.items():
        if tensor.stop_gradient or tensor.grad is None:
            continue
        grads[key] = np.asarray(dist.reshard(tensor.grad, MESH, [dist.Replicate()]).numpy())
    return grads, saved, local


def main() -> None:
    record: dict = {"kernels": {d: [kernels.rounds_in_place(4096, d), rounding.cast_is_exact(d)] for d in UNIT}}
    for dtype in UNIT:
        for rows in (128, 64):
            table = record.setdefault(dtype, {}).setdefault(f"local{rows * COLS // 2}", {})
            for name in sorted(SAMPLES):
                if name in UNSUPPORTED:
                    table[name] = "paddle"
                    continue
                expected, saved, _ = run(name, rows, None)
                del calls[:]
                got, _, local = run(name, rows, dtype)
                error = max(float(np.max(np.abs(got[k] - g))) / float(np.max(np.abs(g))) / UNIT[dtype]
                            for k, g in expected.items())
                table[name] = {"error": error, "saved": saved, "in_place": len(calls), "local": local,
                               "finite": all(bool(np.isfinite(g).all()) for g in got.values())}
    with open(f"{out_dir}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(record, f)


main()
