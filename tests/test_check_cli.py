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


def no_gpu_reason() -> str:
    """What check says where there is no GPU: a CPU build, or a GPU build that sees none (a
    container started without --gpus)."""
    import paddle

    if not paddle.device.is_compiled_with_cuda():
        return "Paddle is a CPU build without CUDA"
    if paddle.device.cuda.device_count() == 0:
        return "Paddle has CUDA but sees no GPU (driver, container --gpus, or CUDA_VISIBLE_DEVICES)"
    pytest.skip("this machine has a GPU: tests/gpu covers it")


def test_human_report_without_a_gpu():
    reason = no_gpu_reason()
    proc = run_cli()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    cuda = "CPU build" if reason.startswith("Paddle is a CPU build") else "/"
    for expected in ("Paddle", cuda, "numpy", "GPUs", f"none: {reason}", "Verdict: float32 (AMP off)"):
        assert expected in out
    assert "Traceback" not in proc.stderr and "ccache" not in proc.stderr


def test_the_report_says_how_the_fp16_rehearsal_rounds(tmp_path):
    from paddle_amp_ext._native import status

    current = status()
    proc = run_cli("--json", "--build-kernel")
    assert json.loads(proc.stdout)["rehearsal_rounding"] == {"native": current.available, "detail": current.detail}
    assert f"fp16 rehearsal rounds with the {current}" in run_cli("--build-kernel").stdout
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


def test_require_without_a_gpu_exits_1_and_says_why():
    reason = no_gpu_reason()
    proc = run_cli("--require", "any")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"python -m paddle_amp_ext.check: --require any is not met: AMP is off and training runs in float32: {reason}.")


@pytest.mark.parametrize("what_if, require, reason", [
    ("Tesla T4:7.5", "bf16", "bfloat16 AMP requested, but bfloat16 needs compute capability 8.0; Tesla T4 "
                             "(compute capability 7.5) cannot run it, so training runs in float32."),
    ("Tesla K80:3.7", "fp16", "float16 AMP requested, but Tesla K80 (compute capability 3.7) is below compute "
                              "capability 7.0: it has no Tensor Cores, so float16 AMP would not be faster and may "
                              "be slower; training runs in float32."),
])
def test_a_failed_require_names_the_requirement_and_why(what_if, require, reason, capsys, caplog):
    assert main(["--json", "--what-if", what_if, "--require", require]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["require"] == {"name": require, "met": False,
                                                   "reason": f"--require {require} is not met: {reason}"}
    assert captured.err == f"python -m paddle_amp_ext.check: --require {require} is not met: {reason}\n"
    assert not [r for r in caplog.records if r.levelname == "WARNING"], "the gate's fallback warning is not printed"
    assert main(["--json", "--what-if", "NVIDIA A100:8.0", "--require", require]) == 0
    assert json.loads(capsys.readouterr().out)["require"] == {"name": require, "met": True, "reason": None}


def without_paddle(tmp_path, *command: str) -> subprocess.CompletedProcess:
    """``command`` in a Python where ``import paddle`` fails (a sitecustomize blocks it)."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['paddle'] = None\n")
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])}
    return subprocess.run(list(command), capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(sys.version_info < (3, 10), reason="python -m is recognised through sys.orig_argv (3.10+)")
@pytest.mark.parametrize("module", ["paddle_amp_ext.check", "paddle_amp_ext.cli.check"])
def test_without_paddle_check_says_so_with_the_usage_exit_code(tmp_path, module):
    proc = without_paddle(tmp_path, sys.executable, "-m", module, "--json")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("python -m paddle_amp_ext.check: error: PaddlePaddle cannot be imported (")
    assert "docs/install.md" in proc.stderr and "https://www.paddlepaddle.org.cn/packages/stable/cu126/" in proc.stderr
    assert without_paddle(tmp_path, sys.executable, "-m", module, "--help").returncode == 0
    assert without_paddle(tmp_path, sys.executable, "-m", module, "--bogus").returncode == 2
    imported = without_paddle(tmp_path, sys.executable, "-c", "import paddle_amp_ext")
    assert imported.returncode == 1 and "ImportError: paddle-amp-ext needs PaddlePaddle" in imported.stderr


def test_without_paddle_the_console_script_says_so_too(tmp_path):
    exe = Path(sys.executable).parent / "paddle-amp-check"
    if not exe.exists():
        pytest.skip("the console script is not installed in this venv")
    proc = without_paddle(tmp_path, str(exe))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: PaddlePaddle cannot be imported" in proc.stderr


def test_check_writes_nothing_unless_asked(tmp_path):
    """No kernel build as a side effect: the cache folder stays absent, the report says so."""
    from paddle_amp_ext._native import build

    cache = tmp_path / "cache"
    env = {**os.environ, build.ENV_CACHE: str(cache), build.ENV_SYSTEM: str(tmp_path / "none")}
    env.pop(build.ENV_SWITCH, None)
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", "--json"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rounding = json.loads(proc.stdout)["rehearsal_rounding"]
    if build.platform.machine().lower() not in build._X86:
        pytest.skip("no F16C kernel on this CPU")
    assert rounding["native"] is False and rounding["detail"].startswith("not built yet: ")
    assert sorted(os.listdir(tmp_path)) == [], "nothing written"
    asked = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", "--json", "--build-kernel"],
                           capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    built = json.loads(asked.stdout)["rehearsal_rounding"]
    if build.compiler() is None:
        pytest.skip("no C compiler: nothing to build")
    assert built["native"] is True and built["detail"].startswith(str(cache / build.library_prefix()))
    again = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", "--json"], capture_output=True,
                           text=True, timeout=120, env=env, cwd=tmp_path)
    assert json.loads(again.stdout)["rehearsal_rounding"] == built, "found once built, still without writing"


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


@pytest.mark.parametrize("what_if, kind, dtype_30, dtype_26", [
    ("xpu:2", "xpu", "float16", "float16"),
    ("XPU:xpu3", "xpu", "bfloat16", "float16"),
    ("custom:npu", "custom", "bfloat16", "float16"),
    ("custom:MLU", "custom", "float16", "float16"),
    ("rocm:MI250X:9.0", "rocm", "bfloat16", "float16"),
])
def test_what_if_for_rocm_xpu_and_custom_devices_gives_paddles_verdict(what_if, kind, dtype_30, dtype_26, capsys):
    from paddle_amp_ext._compat import PADDLE_VERSION

    expected = dtype_30 if PADDLE_VERSION[0] >= 3 else dtype_26
    code = main(["--json", "--what-if", what_if, "--require", "bf16"])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if expected == "bfloat16" else 1)
    assert data["what_if"] is True and data["devices"] == [] and data["decision"]["dtype"] == expected
    assert data["accelerator"]["kind"] == kind and data["accelerator"]["bf16"] == (expected == "bfloat16")
    assert "python/paddle/amp/auto_cast.py" in data["accelerator"]["rule"]
    assert data["require"]["met"] == (expected == "bfloat16")
    main(["--what-if", what_if])
    out = capsys.readouterr().out
    assert "Devices (what-if, not present)" in out and f"Verdict: {expected}" in out


def test_a_probed_accelerator_is_reported_with_paddles_rule(monkeypatch, capsys):
    from paddle_amp_ext import device
    from paddle_amp_ext.backends import Accelerator

    monkeypatch.setattr(device, "probe_accelerator", lambda: Accelerator("custom", index=1, device_type="npu"))
    main(["--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["accelerator"]["device_type"] == "npu" and data["accelerator"]["index"] == 1
    assert data["probe_reason"] is None and "custom device npu:1" in data["decision"]["reason"]

    def broken():
        raise RuntimeError("Paddle could not describe its custom device: boom")

    monkeypatch.setattr(device, "probe_accelerator", broken)
    main(["--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["accelerator"] is None
    assert "probe error: Paddle could not describe its custom device: boom" in data["notes"]
