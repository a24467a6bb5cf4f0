"""Hostile inputs to the FP8 readiness verdict: odd version strings, odd devices, odd arch lists."""

from __future__ import annotations

import pytest

from paddle_amp_ext.check import main
from paddle_amp_ext.fp8 import readiness as rd
from paddle_amp_ext.gate import DeviceInfo

H100 = DeviceInfo(0, "H100", (9, 0))


@pytest.mark.parametrize("cuda", ["", "False", "abc", "12", "12.8.1-rc", "V12.8"])
def test_unreadable_or_partial_cuda_versions_never_raise(cuda):
    got = rd.fp8_readiness(H100, rd.Fp8Software("3.3.1", True, frozenset(rd.API_NEEDS["per_tensor"]), cuda, None))
    assert got[0].recipe == "per_tensor" and got[0].ok  # Hopper needs no CUDA 12.1 check


def test_old_cuda_strings_compare_numerically():
    assert rd._at_least("12.10", (12, 8)) is True
    assert rd._at_least("9.2", (12, 1)) is False
    assert rd._at_least(None, (12, 1)) is None


def test_bad_device_is_rejected_by_device_info():
    with pytest.raises(ValueError, match="compute_capability must be a"):
        DeviceInfo(0, "x", (9, "0"))


def test_require_fp8_with_a_bad_what_if_is_a_usage_error(capsys):
    assert main(["--what-if", "H100", "--require", "fp8"]) == 2


def test_unknown_require_is_a_usage_error(capsys):
    assert main(["--require", "fp4"]) == 2


def test_render_of_no_verdicts_is_empty():
    assert rd.render(()) == []
