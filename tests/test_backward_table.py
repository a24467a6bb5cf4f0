"""The table of outputs each backward reads, checked against the installed Paddle.

The table (``paddle_amp_ext/_compat/backward_table.py``) is generated from Paddle's grad op
makers by ``scripts/backward_reads_output.py``; the rehearsal never rounds in place an output the
table says its backward reads. Here: the generator, run on the installed Paddle, gives the
committed table (a new Paddle whose backward changed fails here until it is regenerated), and
Paddle's eager backward raises after an in-place change of an op's output exactly where the
table says it reads it, for every op the rehearsal rounds.
"""

from __future__ import annotations

import importlib.util
import pathlib

import paddle
import paddle.nn.functional as F  # noqa: N812
import pytest
from backward_samples import SAMPLES, make_inputs, outputs

from paddle_amp_ext._compat import backward
from paddle_amp_ext.rehearsal import ops

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROUNDED = sorted({name for name, _, kind in (*ops.FUNCTIONS, *ops.METHODS) if kind != ops.MOVE} - {"_conv_nd"}
                 - {n for n in ("conv3d", "conv1d_transpose", "conv2d_transpose", "conv3d_transpose")})


def _generator():
    spec = importlib.util.spec_from_file_location("backward_reads_output", ROOT / "scripts" / "backward_reads_output.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_what_the_installed_paddle_defines():
    generator = _generator()
    derived, _ = generator.derive()
    committed = generator.parse((ROOT / "paddle_amp_ext" / "_compat" / "backward_table.py").read_text())
    major = paddle.__version__.split(".")[0]
    assert major in committed, f"no table for paddlepaddle {paddle.__version__}: run the generator"
    table = committed[major][1]
    assert sorted(table) == sorted(derived)
    changed = {node: (table[node][1], derived[node][1]) for node in derived if table[node][1] != derived[node][1]}
    assert changed == {}, "the backward of these ops changed: regenerate the table (scripts/backward_reads_output.py)"
    assert backward.table() == {node: entry if entry[1] else ((), ()) for node, entry in table.items()}


def test_every_op_the_rehearsal_rounds_has_a_sample():
    assert sorted(set(ROUNDED) - set(SAMPLES)) == []


def _raises_after_an_in_place_change(name: str, index: int) -> bool:
    out = outputs(SAMPLES[name](make_inputs()))
    target = out[index]
    target.add_(paddle.zeros_like(target))  # an in-place op: bumps the tensor's version
    loss = sum((t * t).sum() for t in out if not t.stop_gradient)
    try:
        loss.backward()
    except (RuntimeError, ValueError, PermissionError) as error:  # Paddle's PermissionDenied
        assert "inplace" in str(error).replace("in-place", "inplace")
        return True
    return False


@pytest.mark.parametrize("name", ROUNDED)
def test_the_table_says_which_outputs_paddles_backward_reads(name):
    """Forward, change the output in place, backward: Paddle raises exactly where the table says
    the backward reads the output; where the op has no output named ``out`` (the cross entropy's
    ``softmax``, ``loss``) the rule is conservative: a read output may be any of them."""
    if name not in {attribute for _, attribute, _, _ in ops._entry_points()}:
        pytest.skip(f"this Paddle has no {name}")
    for index, out in enumerate(outputs(SAMPLES[name](make_inputs()))):
        node = backward.node_name(out.grad_fn)
        assert node in backward.table(), f"{name} makes {node}, which the table does not know"
        saved = backward.saved_by_backward(out)
        raised = _raises_after_an_in_place_change(name, index)
        outputs_of_op, read = backward.table()[node]
        if raised or "out" in outputs_of_op or not read:
            assert saved == raised, (name, node, index)
        else:  # conservative: the op's outputs are not told apart
            assert saved


@pytest.mark.parametrize("call", [
    lambda x: F.relu(x), lambda x: paddle.exp(x), lambda x: F.gelu(x, approximate=True),
    lambda x: F.relu_(x * 1.0), lambda x: paddle.nn.functional.hardswish(x), lambda x: paddle.pow(x, 2.0),
    lambda x: F.elu(x), lambda x: F.softplus(x), lambda x: paddle.cumsum(x, 0), lambda x: paddle.rsqrt(x * x + 1),
], ids=["relu", "exp", "gelu_tanh", "relu_", "hardswish", "pow", "elu", "softplus", "cumsum", "rsqrt"])
def test_ops_outside_the_rehearsals_lists_follow_the_table_too(call):
    """Ops a rehearsal does not round, and inplace variants (``relu_``: the node keeps its output,
    which is its input), agree with the table as well."""
    x = make_inputs()["x"]
    out = call(x)
    saved = backward.saved_by_backward(out)
    out.add_(paddle.zeros_like(out))
    try:
        (out * out).sum().backward()
        raised = False
    except (RuntimeError, ValueError, PermissionError):
        raised = True
    assert saved == raised


def test_swiglu_reads_its_inputs_only():
    swiglu = getattr(F, "swiglu", None)
    if swiglu is None:
        pytest.skip("paddle.nn.functional.swiglu is not in this Paddle (2.6.2)")
    i = make_inputs()
    out = swiglu(i["x"], i["y"])
    assert out.grad_fn.name() == "SwigluGradNode"
    assert not backward.saved_by_backward(out)
    out.add_(paddle.zeros_like(out))
    (out * out).sum().backward()  # does not raise


def test_a_tensor_without_a_grad_node_is_read_by_none():
    x = paddle.rand([4])
    assert not backward.saved_by_backward(F.silu(x))
    leaf = paddle.rand([4])
    leaf.stop_gradient = False
    with paddle.no_grad():
        assert not backward.saved_by_backward(F.silu(leaf))


def test_a_node_the_table_does_not_know_is_taken_to_read_its_output():
    class Twice(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    x = paddle.rand([4])
    x.stop_gradient = False
    assert backward.saved_by_backward(Twice.apply(x))
