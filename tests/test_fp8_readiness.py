"""The FP8 readiness verdict per recipe, through the seams (injected GPUs and Paddle facts)."""

from __future__ import annotations

import json

import pytest

from paddle_amp_ext.check import main
from paddle_amp_ext.fp8 import readiness as rd
from paddle_amp_ext.gate import DeviceInfo

ALL_APIS = frozenset(name for names in rd.API_NEEDS.values() for name in names)
H100 = DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0))
L40S = DeviceInfo(0, "NVIDIA L40S", (8, 9))
A100 = DeviceInfo(0, "NVIDIA A100-SXM4-80GB", (8, 0))
B200 = DeviceInfo(0, "NVIDIA B200", (10, 0))


def sw(cuda="12.8", cublas="12.8.5.5", apis=ALL_APIS, dtypes=True, archs=()):
    return rd.Fp8Software("3.3.1", dtypes, frozenset(apis), cuda, cublas, archs)


def verdicts(device, software):
    return {v.recipe: v for v in rd.fp8_readiness(device, software)}


def test_hopper_with_cuda_12_8_runs_every_recipe():
    got = verdicts(H100, sw())
    assert [got[r].ok for r in rd.RECIPES] == [True, True, True, True]
    assert got["blockwise"].reason == "NVIDIA H100 80GB HBM3 (compute capability 9.0) with CUDA 12.8 can run it."
    assert got["blockwise"].source == "paddle/phi/kernels/legacy/gpu/fp8_gemm_blockwise_kernel.cu"


def test_ada_runs_per_tensor_and_qat_but_not_blockwise_or_deep_gemm():
    got = verdicts(L40S, sw())
    assert (got["per_tensor"].ok, got["ernie_qat"].ok, got["blockwise"].ok, got["deep_gemm"].ok) == (True, True, False, False)
    assert "block-scale modes run on compute capability 9.0" in got["blockwise"].reason
    old = verdicts(L40S, sw(cuda="12.0"))["per_tensor"]
    assert not old.ok and old.reason == ("on NVIDIA L40S (compute capability 8.9) fp8_fp8_half_gemm_fused needs "
                                         "CUDA 12.1+, Paddle has CUDA 12.0.")


def test_ampere_has_no_fp8():
    got = verdicts(A100, sw())
    assert not any(v.ok for v in got.values())
    assert got["per_tensor"].reason.startswith("NVIDIA A100-SXM4-80GB (compute capability 8.0) has no FP8 Tensor Cores")


def test_blockwise_names_cuda_and_cublas():
    assert "needs CUDA 12.8 and cuBLAS 12.8.5" in verdicts(H100, sw(cuda="12.6"))["blockwise"].reason
    assert verdicts(H100, sw(cublas="12.8.4.1"))["blockwise"].reason == (
        "fp8_gemm_blockwise needs cuBLAS 12.8.5, found cuBLAS 12.8.4.1.")
    unknown = verdicts(H100, sw(cublas=None))["blockwise"]
    assert unknown.ok and unknown.reason.endswith("if cuBLAS is 12.8.5 or later (its version could not be read).")


def test_ernie_qat_refuses_blackwell_as_paddleformers_does():
    got = verdicts(B200, sw())
    assert not got["ernie_qat"].ok and "accepts only arch 89 and 90" in got["ernie_qat"].reason
    assert got["ernie_qat"].source == "paddleformers/quantization/quantization_config.py"
    assert got["deep_gemm"].ok and not got["blockwise"].ok


def test_paddle_2_6_has_no_fp8_dtypes():
    for v in rd.fp8_readiness(H100, rd.Fp8Software("2.6.2", False)):
        assert not v.ok
        assert v.reason.startswith("Paddle 2.6.2 has no FP8 dtypes (paddle.float8_e4m3fn and float8_e5m2 arrived in Paddle 3.0)")


def test_missing_api_and_no_device_and_arch_list():
    got = verdicts(H100, sw(apis=ALL_APIS - {"deep_gemm"}))["deep_gemm"]
    assert not got.ok and got.reason == "this install lacks deep_gemm."
    none = rd.fp8_readiness(None, sw(), no_device_reason="Paddle is a CPU build")
    assert {v.reason for v in none} == {"FP8 needs an sm_89+ GPU: Paddle is a CPU build."}
    built_for_ampere = verdicts(H100, sw(archs=(80,)))["per_tensor"]
    assert not built_for_ampere.ok and "compiled for sm_80" in built_for_ampere.reason


def test_probe_software_reads_this_paddle():
    import paddle

    got = rd.probe_software()
    assert got.paddle_version == paddle.__version__
    assert got.fp8_dtypes == hasattr(paddle, "float8_e4m3fn")
    if got.fp8_dtypes:
        assert "paddle.incubate.nn.functional.fp8_quant_blockwise" in got.apis


@pytest.mark.parametrize("what_if, code", [("NVIDIA H100:9.0:80", 0), ("NVIDIA A100:8.0:80", 1), ("Tesla T4:7.5", 1)])
def test_check_require_fp8_with_what_if(what_if, code, capsys, monkeypatch):
    monkeypatch.setattr(rd, "probe_software", lambda: sw(cuda="12.8"))
    assert main(["--json", "--what-if", what_if, "--require", "fp8"]) == code
    data = json.loads(capsys.readouterr().out)
    assert [v["recipe"] for v in data["fp8"]] == list(rd.RECIPES)
    assert any(v["ok"] for v in data["fp8"]) == (code == 0)


def test_check_text_lists_the_recipes(capsys, monkeypatch):
    monkeypatch.setattr(rd, "probe_software", lambda: rd.Fp8Software("2.6.2", False))
    assert main(["--what-if", "NVIDIA H100:9.0", "--require", "fp8"]) == 1
    out = capsys.readouterr().out
    assert "FP8 recipes" in out and "per_tensor  no   Paddle 2.6.2 has no FP8 dtypes" in out


def test_check_on_this_machine_without_a_gpu_is_not_fp8_ready(capsys):
    assert main(["--require", "fp8"]) == 1
