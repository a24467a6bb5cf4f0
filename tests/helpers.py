"""Small models and data shared by the tests."""

from __future__ import annotations

import contextlib
import os
from typing import Callable

import numpy as np
import paddle
import pytest

#: A script's routed training steps: two steps of ``paddle.amp.GradScaler`` on a small model (after ``import paddle``).
SCALER_STEPS = """
model = paddle.nn.Linear(4, 4)
opt = paddle.optimizer.SGD(parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=8)
for _ in range(2):
    loss = model(paddle.rand([2, 4])).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
"""


def make_mlp(seed: int = 0, width: int = 16, depth: int = 2, inputs: int = 8, outputs: int = 1):
    paddle.seed(seed)
    layers = []
    size = inputs
    for _ in range(depth):
        layers += [paddle.nn.Linear(size, width), paddle.nn.ReLU()]
        size = width
    layers.append(paddle.nn.Linear(size, outputs))
    return paddle.nn.Sequential(*layers)


def make_data(seed: int = 1, n: int = 32, inputs: int = 8, outputs: int = 1):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal((n, inputs)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((n, outputs)).astype("float32"))
    return x, y


def params_of(model) -> list:
    return [p.numpy().copy() for p in model.parameters()]


def in_another_thread(probe):
    """``probe()`` run in a new thread (while the caller stays inside its contexts); its result."""
    import threading

    result = {}
    thread = threading.Thread(target=lambda: result.update(value=probe()))
    thread.start()
    thread.join(30)
    return result["value"]


def require_native_kernel() -> None:
    """Skip where the one-pass F16C rounding kernel cannot be had; under CI=true (an x86 machine
    with gcc) fail instead, unless PADDLE_AMP_EXT_NATIVE turned it off: the rehearsal's speed
    depends on it there."""
    from paddle_amp_ext._native import status

    current = status()
    if not current.available:
        if os.environ.get("CI") == "true" and not current.detail.startswith("turned off by"):
            pytest.fail(f"the native fp16 kernel is not available under CI: {current}")
        pytest.skip(str(current))


def kernel_name() -> str:
    """The native kernel's cached file name for this machine's C compiler."""
    from paddle_amp_ext._native import build

    return build.library_name(build.compiler_identity(build.compiler()))


def no_compiler(monkeypatch, tmp_path) -> None:
    """No C compiler for the native kernel's build: an empty PATH, no CC, none from sysconfig."""
    from paddle_amp_ext._native import build, cache

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(cache.sysconfig, "get_config_var", lambda name: None)
    assert build.compiler() is None


def fp16(values):
    """``values`` as float16 stores them (numpy's conversion), as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)


def toolkit_python(variable: str, script: str) -> str:
    """The toolkit venv's Python that the environment ``variable`` names (scripts/test builds the
    venv and sets it) to run ``script``. Without the variable: skip, or under CI=true fail."""
    python = os.environ.get(variable)
    if not python:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run {script}: {variable} is not set")
        pytest.skip(f"{variable} is not set (bash scripts/test builds the toolkit's venv)")
    return python


def run_trainer_check(variable: str, script: str, out) -> tuple:
    """Run ``tests/SCRIPT OUT`` with :func:`toolkit_python`; returns (its last stdout line as
    JSON, its stderr)."""
    import json
    import subprocess
    from pathlib import Path

    python = toolkit_python(variable, script)
    proc = subprocess.run([python, str(Path(__file__).parent / script), str(out)], capture_output=True, text=True,
                          timeout=600, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


#: A script's first lines: ``model``, one TransformerEncoderLayer whose attention logits reach 80000
#: (q and k projections at 100), beyond float16's range (doctor and advisor scripts build on it).
ATTENTION_MODEL_SCRIPT = """
import paddle
paddle.seed(0)
layer = paddle.nn.TransformerEncoderLayer(d_model=64, nhead=1, dim_feedforward=64, dropout=0.0)
for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
    proj.weight.set_value(paddle.zeros_like(proj.weight))
    proj.bias.set_value(paddle.full_like(proj.bias, 100.0))
model = paddle.nn.Sequential(layer)
"""


def bf16(values):
    """``values`` rounded to the nearest bfloat16 (ties to even) on the bit pattern, as float32."""
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), values, nearest)


@contextlib.contextmanager
def serving(name: str, command: list, port: int, ready: Callable[[str], bool], timeout: float = 60):
    """A dashboard server (``command``, listening on 127.0.0.1:``port``) until ``ready(base_url)``;
    yields the base URL and terminates it after (killed if it does not stop)."""
    import subprocess
    import time

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            try:
                if ready(base):
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise AssertionError(f"{name} did not start: " + proc.stdout.read(2000).decode(errors="replace"))
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
