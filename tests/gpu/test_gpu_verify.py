"""`check --verify`'s checks as tests, on a CUDA GPU (skipped at run time elsewhere, with the reason).

Not run yet: there was no GPU where they were written. `bash scripts/test-gpu` runs them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from paddle_amp_ext.check import main
from paddle_amp_ext.verify.command import dtypes_of, find_gpu
from paddle_amp_ext.verify.comparisons import compare_outputs
from paddle_amp_ext.verify.gpu_checks import DeviceRunner, OverflowOutcome
from paddle_amp_ext.verify.models import OVERFLOWING_LINEAR, STANDARD
from paddle_amp_ext.verify.pipeline import op_dtype_checks, rehearsal_checks, throughput, unscale_checks


def _dtypes() -> tuple:
    device, reason = find_gpu()
    assert device is not None, reason
    return dtypes_of(device)


def _float16() -> None:
    if "float16" not in _dtypes():
        pytest.skip("this GPU is below compute capability 7.0: float16 AMP is off")


def test_ops_run_in_the_dtypes_the_lists_predict():
    checks = op_dtype_checks(DeviceRunner(), _dtypes())
    assert checks and [(c.name, c.details) for c in checks if c.status != "pass"] == []


def test_a_real_float16_overflow_is_skipped_and_backed_off():
    _float16()
    assert DeviceRunner().overflow() == OverflowOutcome(skipped=True, found_inf=True, scale_before=65536.0,
                                                        scale_after=32768.0, weights_unchanged=True)


def test_the_cuda_unscale_kernel_matches_the_emulation_in_every_dtype():
    checks = unscale_checks(DeviceRunner())
    assert [(c.name, c.status, c.summary) for c in checks if c.status != "pass"] == []


def test_the_rehearsal_matches_the_gpu_on_the_same_layers():
    checks = rehearsal_checks(DeviceRunner(), _dtypes(), tuple(STANDARD) + (OVERFLOWING_LINEAR,))
    assert [(c.name, c.summary, c.details) for c in checks if c.status != "pass"] == []


def test_the_overflowing_rows_are_inf_on_the_gpu_and_in_the_rehearsal():
    _float16()
    gpu, rehearsed = DeviceRunner().rehearsal(OVERFLOWING_LINEAR, "float16")
    assert np.isinf(gpu[6:]).all() and np.isfinite(gpu[:6]).all()
    assert compare_outputs(gpu, rehearsed, "float16").nonfinite_both == 10 * 64


def test_the_throughput_verdict_has_every_configuration_and_peak_memory():
    verdicts, failures = throughput(DeviceRunner(), STANDARD[:1], _dtypes())
    assert failures == []
    (verdict,) = verdicts
    assert [r.config for r in verdict.rows] == ["fp32"] + [f"{level}-{d}" for d in _dtypes() for level in ("O1", "O2")]
    assert all(r.median > 0 for r in verdict.rows)
    assert verdict.pays or verdict.reasons


def test_the_command_on_the_gpu(capsys):
    code = main(["--verify", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "passed", [c for c in data["checks"] if c["status"] == "fail"]
    assert code == 0 and data["needs_gpu"] is None and data["device"]
