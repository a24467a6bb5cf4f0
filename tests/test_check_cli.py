"""`python -m paddle_amp_ext.check` on this CPU machine: output, JSON schema, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paddle_amp_ext.check import main, parse_what_if


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", *args],
                          capture_output=True, text=True, timeout=120)


def test_human_report_on_a_cpu_build():
    proc = run_cli()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in ("Paddle", "CPU build", "numpy", "GPUs", "none: Paddle is a CPU build",
                     "Verdict: float32 (AMP off)"):
        assert expected in out
    assert "Traceback" not in proc.stderr and "ccache" not in proc.stderr


def test_the_report_says_how_the_fp16_rehearsal_rounds():
    from paddle_amp_ext._native import status

    current = status()
    proc = run_cli("--json")
    assert json.loads(proc.stdout)["rehearsal_rounding"] == {"native": current.available, "detail": current.detail}
    assert f"fp16 rehearsal rounds with the {current}" in run_cli().stdout
    off = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PADDLE_AMP_EXT_NATIVE": "0"})
    assert ("fp16 rehearsal rounds with the Paddle kernels (13 passes): turned off by PADDLE_AMP_EXT_NATIVE=0"
            in off.stdout)


def test_json_schema_is_stable():
    proc = run_cli("--json")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert {"paddle_version", "cuda_version", "devices", "decision"} <= set(data)
    assert set(data["decision"]) == {"enabled", "dtype", "use_loss_scaling", "reason"}
    assert data["devices"] == [] and data["decision"]["dtype"] == "float32"


@pytest.mark.parametrize(
    "what_if, require, code, dtype",
    [
        ("Tesla V100-SXM2-16GB:7.0:16", "fp16", 0, "float16"),
        ("Tesla V100-SXM2-16GB:7.0:16", "bf16", 1, "float16"),
        ("NVIDIA A100-SXM4-40GB:8.0:40", "bf16", 0, "bfloat16"),
        ("Tesla K80:3.7", "any", 1, "float32"),
        ("Tesla T4:7.5", "any", 0, "float16"),
    ],
)
def test_what_if_and_require(what_if, require, code, dtype, capsys):
    assert main(["--json", "--what-if", what_if, "--require", require]) == code
    data = json.loads(capsys.readouterr().out)
    assert data["what_if"] is True and data["decision"]["dtype"] == dtype
    device = data["devices"][0]
    assert set(device) >= {"index", "name", "compute_capability", "total_memory_mb", "fp16", "bf16"}
    assert device["name"] == what_if.split(":")[0]


def test_require_without_a_gpu_exits_1():
    assert run_cli("--require", "any").returncode == 1


@pytest.mark.parametrize("args", [["--what-if", "V100"], ["--what-if", "V100:seven"], ["--require", "fp4"], ["--bogus"]])
def test_usage_errors_exit_2_with_a_message(args):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert "error" in proc.stderr and "Traceback" not in proc.stderr


def test_what_if_parsing():
    info = parse_what_if("NVIDIA GeForce RTX 4090:8.9:24")
    assert (info.name, info.compute_capability, info.total_memory_mb) == ("NVIDIA GeForce RTX 4090", (8, 9), 24576)
    with pytest.raises(ValueError, match="NAME:CC"):
        parse_what_if("4090")


def test_smoke_is_skipped_without_a_gpu(capsys):
    assert main(["--smoke"]) == 0
    assert "Smoke test: skipped: no GPU" in capsys.readouterr().out


def test_a_failed_probe_says_could_not_collect(monkeypatch, capsys):
    import paddle

    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(paddle.device, "is_compiled_with_cuda", broken)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "none: could not collect GPU information" in out
    assert "probe error: RuntimeError('driver exploded')" in out


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "paddle-amp-check"
    assert exe.exists() or shutil.which("paddle-amp-check")
    proc = subprocess.run([str(exe), "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ})
    assert proc.returncode == 0 and json.loads(proc.stdout)["decision"]
