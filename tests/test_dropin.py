"""The package is a drop-in for paddle.amp: same names, signatures, defaults and results."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import make_data, make_mlp, params_of

import paddle_amp_ext


def documented_loop(amp, steps: int = 5):
    """Paddle's documented AMP loop, with `amp` standing for paddle.amp or paddle_amp_ext."""
    model = make_mlp(seed=3)
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=1024)
    x, y = make_data()
    for _ in range(steps):
        with amp.auto_cast():
            loss = paddle.nn.functional.mse_loss(model(x), y)
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
    return params_of(model)


def test_documented_loop_gives_the_same_parameters_as_paddle_amp():
    ours = documented_loop(paddle_amp_ext)
    theirs = documented_loop(paddle.amp)
    assert len(ours) == len(theirs) == 6
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    untrained = params_of(make_mlp(seed=3))
    assert not np.array_equal(ours[0], untrained[0]), "the loop must actually train"


@pytest.mark.parametrize(
    "name", ["auto_cast", "decorate", "is_float16_supported", "is_bfloat16_supported"]
)
def test_functions_keep_paddles_parameters_and_defaults(name):
    ours = inspect.signature(getattr(paddle_amp_ext, name)).parameters
    theirs = inspect.signature(getattr(paddle.amp, name)).parameters
    for pname, param in theirs.items():
        assert pname in ours, f"{name} lost Paddle's parameter {pname}"
        assert ours[pname].default == param.default, f"{name}({pname}) default differs"
    assert list(ours)[: len(theirs)] == list(theirs), "positional order must match Paddle's"


def test_grad_scaler_keeps_paddles_parameters_and_defaults():
    ours = inspect.signature(paddle_amp_ext.GradScaler.__init__).parameters
    theirs = inspect.signature(paddle.amp.GradScaler.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for pname, param in theirs.items():
        assert ours[pname].default == param.default
    assert issubclass(paddle_amp_ext.GradScaler, paddle.amp.GradScaler)


def test_version_and_public_names():
    assert paddle_amp_ext.__version__ == "0.1.0"
    for name in paddle_amp_ext.__all__:
        assert getattr(paddle_amp_ext, name) is not None


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_without_paddle_names_the_extras():
    proc = _run("import sys; sys.modules['paddle'] = None\nimport paddle_amp_ext")
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "paddle-amp-ext[gpu]" in proc.stderr and "paddle-amp-ext[cpu]" in proc.stderr


def test_import_does_not_load_visualdl():
    proc = _run("import sys, paddle_amp_ext; print('visualdl' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_package_ships_py_typed():
    from pathlib import Path

    assert (Path(paddle_amp_ext.__file__).parent / "py.typed").exists()
