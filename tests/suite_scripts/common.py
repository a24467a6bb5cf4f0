"""What the suite-shaped scripts share (own code): tiny synthetic data, an overflow to inject, the report.

Every script takes ``--out DIR`` (where ``report.json`` goes), ``--steps N`` and
``--overflow-step K``: the 1-based step whose input batch is multiplied by 1e6. Float32 takes
that in its stride (the BatchNorm after the first conv normalizes it away), float16 does not:
the conv's output is far beyond 65504, so under ``run --emulate float16`` that step's
gradients are non-finite and the scaler skips it.
"""

import json
import os

import numpy as np
import paddle

OVERFLOW_FACTOR = 1e6


def add_common_args(parser):
    parser.add_argument("--out", required=True, help="folder for report.json")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overflow-step", type=int, default=0, help="1-based step with a huge input (0: none)")
    parser.add_argument("--wait-after", type=int, default=0,
                        help="after this many steps print 'waiting' and sleep until a signal ends the process")


def images(step, batch=2, channels=3, size=8, seed=0):
    """The batch of ``step`` (1-based): deterministic, the same run to run."""
    rng = np.random.default_rng(seed * 1000 + step)
    return rng.standard_normal((batch, channels, size, size)).astype("float32")


def inject(x, step, overflow_step):
    """``x`` scaled by :data:`OVERFLOW_FACTOR` at the overflow step."""
    return x * OVERFLOW_FACTOR if step == overflow_step else x


def trainable(model):
    """The parameters the optimizer updates (Paddle's BatchNorm statistics are parameters too, but
    the forward pass updates them, also in a step whose update is skipped)."""
    return [(name, p) for name, p in model.named_parameters() if not p.stop_gradient]


def snapshot(model):
    return [p.numpy().copy() for _, p in trainable(model)]


def changed(before, model):
    """Whether the optimizer moved any trainable parameter since ``before``."""
    return any(not np.array_equal(b, p.numpy()) for b, (_, p) in zip(before, trainable(model)))


def maybe_wait(step, wait_after):
    if wait_after and step == wait_after:
        print("waiting", flush=True)
        import time

        time.sleep(120)


def write_report(out, model, scaler, losses, updates, scheduler, **extra):
    os.makedirs(out, exist_ok=True)
    weights = {name: p.numpy().ravel().tolist() for name, p in trainable(model)}
    data = {"losses": losses, "updates": updates, "weights": weights,
            "weights_finite": bool(all(np.isfinite(w).all() for w in weights.values())),
            "lr_last_epoch": int(scheduler.last_epoch), "last_lr": float(scheduler.get_lr()),
            "scaler": f"{type(scaler).__module__}.{type(scaler).__name__}" if scaler is not None else None,
            "paddle": paddle.__version__, **extra}
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(data, f)
