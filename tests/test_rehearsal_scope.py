"""Where the rehearsal rounds (``fp16_emulation(model)``: that model's forward; ``rehearse()``:
the thread) and the level it follows (a script's ``auto_cast(level="O2")`` and
``decorate(level="O2")``), against a numpy float16 reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat, _state

F16, F32 = np.float16, np.float32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fp16(values):
    return np.asarray(values, dtype=F32).astype(F16).astype(F32)


def not_fp16(array):
    return not np.array_equal(array, fp16(array))


# --------------------------------------------------------------------------- scope
def mlp(seed):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 8, bias_attr=False), paddle.nn.ReLU(),
                                paddle.nn.Linear(8, 8, bias_attr=False))


def test_a_second_model_in_the_same_thread_is_not_rounded():
    student, teacher, x = mlp(0), mlp(1), paddle.rand([4, 8])
    plain = teacher(x).numpy()
    with amp.fp16_emulation(student):
        assert not not_fp16(student(x).numpy())
        np.testing.assert_array_equal(teacher(x).numpy(), plain)  # a teacher, an EMA copy: float32
        assert not not_fp16(student[0](x).numpy()), "a sublayer called on its own is the model's"
        (student(x).sum() + teacher(x).sum() * 1e-3).backward()
    assert not not_fp16(student[0].weight.grad.numpy()), "the model's gradients are fp16's"
    assert not_fp16(teacher[0].weight.grad.numpy()), "the teacher's are float32"
    with amp.rehearse():
        assert not not_fp16(teacher(x).numpy()), "rehearse() rounds the whole thread"


def test_a_forward_that_raised_leaves_no_scope_behind():
    class Failing(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.inner = paddle.nn.Linear(8, 8, bias_attr=False)

        def forward(self, x):
            self.inner(x)
            raise RuntimeError("out of memory")

    model, teacher, x = Failing(), mlp(1), paddle.rand([4, 8])
    plain = teacher(x).numpy()
    with amp.fp16_emulation(model):
        with pytest.raises(RuntimeError, match="out of memory"):
            model(x)
        np.testing.assert_array_equal(teacher(x).numpy(), plain)
        assert not not_fp16(model.inner(x).numpy())
        assert not _state.in_scope()
        np.testing.assert_array_equal(teacher(x).numpy(), plain)
    assert not _state.in_scope()


# --------------------------------------------------------------------------- O2
def test_decorate_o2_inside_a_rehearsal_holds_the_parameters_in_fp16():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.LayerNorm(4))
    third = np.full([4], 1.0 / 3.0, dtype=F32)
    model[0].bias.set_value(third)
    model[1].weight.set_value(third)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    with amp.fp16_emulation(model):
        model, opt = amp.decorate(model, opt, level="O2")
        np.testing.assert_array_equal(model[0].bias.numpy(), fp16(third)), "cast to fp16, as decorate casts"
        np.testing.assert_array_equal(model[1].weight.numpy(), third), "norms keep float32 parameters"
        assert _state.o2_dtype(model[0]) == ("float16", True) and _state.o2_dtype(model[1]) is None
        model[0].bias.set_value(third)  # as a float32 master weight may be after a step
        with amp.auto_cast(level="O2"):
            out = model[0](paddle.zeros([1, 4]))
        np.testing.assert_array_equal(out.numpy(), fp16(third)[None]), "the forward sees fp16 parameters"
    assert model[0].bias is not None and model[0](paddle.zeros([1, 4])).numpy()[0, 0] == third[0]


def test_decorate_o2_without_master_weights_rounds_after_every_update():
    layer = paddle.nn.Linear(2, 2)
    opt = paddle.optimizer.SGD(learning_rate=1e-4, parameters=layer.parameters())
    with amp.rehearse():
        layer, opt = amp.decorate(layer, opt, level="O2", master_weight=False)
        with amp.auto_cast(level="O2"):
            layer(paddle.ones([1, 2])).sum().backward()
        opt.step()
        assert not_fp16(layer.weight.numpy()), "an update of 1e-4 in float32"
        with amp.auto_cast(level="O2"):
            layer(paddle.ones([1, 2]))
        assert not not_fp16(layer.weight.numpy()), "an fp16 parameter holds fp16 values"


MODEL = textwrap.dedent("""
    import numpy as np
    import paddle

    class Net(paddle.nn.Layer):  # a projection, a LayerScale gamma (1/3: no fp16 value), a head
        def __init__(self):
            super().__init__()
            self.fc1 = paddle.nn.Linear(8, 8, bias_attr=False)
            self.gamma = self.create_parameter(
                [8], default_initializer=paddle.nn.initializer.Assign(np.full([8], 1 / 3, "float32")))
            self.fc2 = paddle.nn.Linear(8, 1)

        def forward(self, x):
            return self.fc2(self.fc1(x) * self.gamma)

    def data():
        rng = np.random.default_rng(0)
        x = (rng.integers(-15, 16, [16, 8]) / 8).astype("float32")
        y = (rng.integers(-15, 16, [16, 1]) / 8).astype("float32")
        return x, y
""")

SCRIPT = MODEL + textwrap.dedent("""
    import json
    import sys

    level = sys.argv[1]
    paddle.seed(0)
    model = Net()
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    model, opt = paddle.amp.decorate(model, opt, level=level)
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
    x, y = (paddle.to_tensor(a) for a in data())
    losses = []
    for step in range(3):
        with paddle.amp.auto_cast(level=level):
            loss = paddle.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        losses.append(float(loss))
    print("LOSSES " + json.dumps(losses))
""")


def first_loss_reference(level):
    """Step 0 in numpy float16: fc1 (fp16 matmul), times gamma (float32 at O1, where gamma is
    float32; fp16 at O2, where decorate cast it), fc2 by this Paddle's linear rule."""
    namespace: dict = {}
    exec(MODEL, namespace)  # noqa: S102 - the test's own model code
    paddle.seed(0)
    net = namespace["Net"]()
    x, y = namespace["data"]()
    w1, gamma = net.fc1.weight.numpy().astype(F16), net.gamma.numpy()
    w2, b2 = net.fc2.weight.numpy().astype(F16), net.fc2.bias.numpy()
    h = np.matmul(x.astype(F16), w1).astype(F32)
    scaled = (h * (fp16(gamma) if level == "O2" else gamma)).astype(F16)
    b2 = fp16(b2) if level == "O2" or _compat.gpu_linear_is_fused() else b2
    if _compat.gpu_linear_is_fused():
        out = fp16(scaled.astype(F32) @ w2.astype(F32) + b2)
    elif level == "O2":
        out = fp16(np.matmul(scaled, w2).astype(F32) + b2)  # fp16 + fp16: an fp16 add
    else:
        out = np.matmul(scaled, w2).astype(F32) + b2  # fp16 + float32: a float32 add
    return float(np.mean((out - y) ** 2, dtype=F32))


def run_emulated(tmp_path, level):
    script = tmp_path / "train_o2.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "paddle_amp_ext.run", "--emulate", "float16", "--no-log", "--json",
                           str(script), level], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = next(line for line in done.stdout.splitlines() if line.startswith("LOSSES "))
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return json.loads(losses[len("LOSSES "):]), summary


def test_run_emulate_follows_an_unmodified_o2_script(tmp_path):
    o2, summary = run_emulated(tmp_path, "O2")
    o1, _ = run_emulated(tmp_path, "O1")
    assert summary["scalers"][0]["steps"] == 3 and summary["scalers"][0]["skipped"] == 0
    np.testing.assert_allclose(o2[0], first_loss_reference("O2"), rtol=1e-6)
    np.testing.assert_allclose(o1[0], first_loss_reference("O1"), rtol=1e-6)
    assert abs(first_loss_reference("O2") - first_loss_reference("O1")) > 1e-5 * first_loss_reference("O1")
    assert all(a != b for a, b in zip(o1, o2)), "O1 and O2 are different numerics"


def test_a_decorated_forward_and_a_layer_without_hooks_are_in_scope():
    """The scope follows a forward through its decorators, and adds no layer hooks (a hooked
    Paddle layer leaves Paddle's fast call path)."""
    import functools

    def logged(forward):
        @functools.wraps(forward)
        def wrapper(*args, **kwargs):
            return forward(*args, **kwargs)
        return wrapper

    class Decorated(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.weight = self.create_parameter([8, 8])

        @logged
        def forward(self, x):
            return paddle.matmul(x, self.weight)

    model, x = Decorated(), paddle.rand([4, 8]) * 3.0
    other = Decorated()  # the same code, another layer: not in scope
    with amp.fp16_emulation(model):
        assert not model._forward_pre_hooks and not model._forward_post_hooks
        assert not not_fp16(model(x).numpy())
        assert not_fp16(other(x).numpy())
