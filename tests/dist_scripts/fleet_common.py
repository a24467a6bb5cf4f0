"""Shared by the fleet scripts: start fleet with a hybrid config on the CPU, build, record.

Test setup only (never the package): Paddle 2.6.2's ``DistributedStrategy`` reads
``FieldDescriptor.label``, which protobuf 7 removed; with the pure-python protobuf
(``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``, set by tests/distributed.py) the property
can be given back from ``is_repeated``/``is_required``.
"""

from __future__ import annotations

import json

import numpy as np
from google.protobuf import descriptor as _descriptor

if not hasattr(_descriptor.FieldDescriptor, "label"):  # protobuf >= 7
    _descriptor.FieldDescriptor.label = property(
        lambda f: 3 if f.is_repeated else (2 if f.is_required else 1))

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle.distributed import fleet  # noqa: E402


def init(**degrees: int):
    """fleet.init(is_collective=True) with these hybrid degrees (others 1); the hcg."""
    strategy = fleet.DistributedStrategy()
    config = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1}
    config.update({f"{k}_degree": v for k, v in degrees.items()})
    strategy.hybrid_configs = config
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()


def mlp(seed: int = 0) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))


def batch(step: int, rank: int, n: int = 8) -> paddle.Tensor:
    rng = np.random.default_rng(100 * step + rank)
    return paddle.to_tensor(rng.standard_normal((n, 4)).astype("float32"))


def params(model: paddle.nn.Layer) -> list:
    return [p.numpy().ravel().tolist() for p in model.parameters()]


def grads(model: paddle.nn.Layer) -> list:
    return [p.grad.numpy().ravel().tolist() for p in model.parameters()]


def value(tensor) -> float | None:
    return None if tensor is None else float(np.asarray(tensor.numpy()).reshape(-1)[0])


def dump(out_dir: str, record: dict) -> None:
    with open(f"{out_dir}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(record, f)


def train(model, opt, forward, *, scaler=None, steps=3, nan_at=None, grad_clip=None, emulate=False,
          after_backward=None) -> dict:
    """``steps`` steps of ``forward(step) -> loss``: Paddle's plain loop without ``scaler``, else
    the scaler's (``emulate``: inside fp16_emulation, so loss scaling runs for real on the CPU).
    A NaN loss at step ``nan_at`` (pass it on one rank only). Records the pre-step local
    gradients (unscaled runs), skips, grad norms and the final parameters."""
    from contextlib import nullcontext

    import paddle_amp_ext as amp

    rec: dict = {"skipped": [], "norms": [], "grads": []}
    with amp.fp16_emulation(model, custom_black_list=["matmul"]) if emulate else nullcontext():
        for step in range(steps):
            loss = forward(step)
            if step == nan_at:
                loss = loss * float("nan")
            (loss if scaler is None else scaler.scale(loss)).backward()
            if after_backward is not None:
                after_backward(step)
            if not emulate:
                rec["grads"].append(grads(model))
            if scaler is None:
                opt.step()
            else:
                result = scaler.step(opt, grad_clip=grad_clip)
                scaler.update()
                rec["skipped"].append(result.skipped)
                rec["norms"].append(value(result.grad_norm))
            opt.clear_grad()
    rec["params"] = params(model)
    return rec
