"""PaddleFormers 1.2.0's FP8 layers on a CPU under fp8_emulation (tests/paddleformers_fp8_check.py)."""

from __future__ import annotations

import pytest
from helpers import run_trainer_check


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_trainer_check("PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "paddleformers_fp8_check.py",
                             tmp_path_factory.mktemp("pf_fp8"))[0]


@pytest.mark.slow
def test_fp8_linear_runs_the_blockwise_recipe_and_restores_fp8_utils(run):
    assert run["linear_forward_equal"], "FP8Linear's output is the 1x128 x 128x128 blockwise GEMM of its inputs"
    assert run["linear_grad_shapes"] == [[2, 64, 256], [256, 384], "paddle.float32"]
    assert run["deep_gemm_before"] is False and run["deep_gemm_after"] is False


@pytest.mark.slow
def test_fp8_mlp_trains_and_tracks_its_float32_twin(run):
    fp8, ref = run["mlp_losses"], run["mlp_ref_losses"]
    assert fp8[-1] < fp8[0] / 5
    # e4m3 keeps 3 significand bits (relative step 2**-3 at worst, 2**-4 on average per value);
    # errors of a 256-term dot product average out, so a loss within 5% of float32 is expected
    for a, b in zip(fp8, ref):
        assert abs(a - b) <= 0.05 * b
