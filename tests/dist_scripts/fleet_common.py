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


def _new_group_then_barrier(new_group):
    """gloo with more than 2 ranks: a rank that races ahead to the next group's creation while
    another still connects the previous one times out (fleet creates many groups in a row)."""

    def wrapped(*args, **kwargs):
        group = new_group(*args, **kwargs)
        dist.barrier()
        return group

    return wrapped


def init(**degrees: int):
    """fleet.init(is_collective=True) with these hybrid degrees (others 1); the hcg.

    Paddle's topology creates its groups through ``paddle.distributed.new_group``; each is
    followed by a barrier here (test setup, see :func:`_new_group_then_barrier`).
    """
    paddle.distributed.new_group = _new_group_then_barrier(paddle.distributed.new_group)
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


COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather")


def counting_collectives(fn, *args, **kwargs):
    """(fn(*args, **kwargs), the paddle.distributed collectives it called: fleet's and the package's)."""
    calls = [0]
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def counted(original):
        def call(*a, **k):
            calls[0] += 1
            return original(*a, **k)
        return call

    for name, original in originals.items():
        setattr(dist, name, counted(original))
    try:
        return fn(*args, **kwargs), calls[0]
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def params(model: paddle.nn.Layer) -> list:
    return [p.numpy().ravel().tolist() for p in model.parameters()]


def grads(model: paddle.nn.Layer) -> list:
    return [[] if p.grad is None else p.grad.numpy().ravel().tolist() for p in model.parameters()]


def value(tensor) -> float | None:
    return None if tensor is None else float(np.asarray(tensor.numpy()).reshape(-1)[0])


def dump(out_dir: str, record: dict) -> None:
    with open(f"{out_dir}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(record, f)


def train(model, opt, forward, *, scaler=None, steps=3, nan_at=None, grad_clip=None, emulate=False,
          optimizer_step=None, parameters=None) -> dict:
    """``steps`` steps of ``forward(step) -> loss``: Paddle's plain loop without ``scaler``, else
    the scaler's (``emulate``: inside fp16_emulation, so loss scaling runs for real on the CPU).
    A NaN loss at step ``nan_at`` (pass it on one rank only); ``optimizer_step`` replaces the
    step/update calls (it must call them itself). Records the pre-step local
    gradients (unscaled runs), skips, grad norms, the collectives each step called
    (:func:`counting_collectives`), the first and the final parameters."""
    from contextlib import nullcontext

    import paddle_amp_ext as amp

    rec: dict = {"skipped": [], "norms": [], "grads": [], "params0": params(model), "hook": [], "collectives": []}
    if scaler is not None:  # what a hook sees at update(): the agreed skip, the global norm
        scaler.add_hook(lambda event: rec["hook"].append([event.result.skipped, value(event.result.grad_norm)]))
    with amp.fp16_emulation(model, custom_black_list=["matmul"]) if emulate else nullcontext():
        for step in range(steps):
            loss = forward(step)
            if step == nan_at:
                loss = loss * float("nan")
            (loss if scaler is None else scaler.scale(loss)).backward()
            if not emulate:
                rec["grads"].append(grads(model))
            if optimizer_step is not None:  # e.g. Paddle's PipelineParallel._optimizer_step
                _, n = counting_collectives(optimizer_step)
            elif scaler is None:
                _, n = counting_collectives(opt.step)
            else:
                _, n = counting_collectives(scaler.step, opt, parameters, grad_clip=grad_clip)
                scaler.update()
            rec["collectives"].append(n)
            if scaler is not None:
                rec["skipped"].append(scaler.last_result.skipped)
                rec["norms"].append(value(scaler.last_result.grad_norm))
            opt.clear_grad()
    rec["params"] = params(model)
    rec["scale"] = None if scaler is None else scaler.loss_scale
    return rec
