"""PaddleFormers' auto-parallel Trainer (``Trainer(enable_auto_parallel=True)``, which turns on
``dist.enable_auto_dp()``) on 2 CPU processes, in the PaddleFormers venv (paddleformers 1.2.0,
Paddle 3.3.1; ``PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON``, built by scripts/test).

``dist_scripts/paddleformers_autodp.py``: a tiny LLaMA, ``amp.route()`` and ``AmpCallback``, an
inf in rank 1's own gradient (its addend, labelled ``Replicate``) before step 3's optimizer step;
fp16 emulated (loss scaling on, ``dist.shard_scaler`` around the routed scaler, as the Trainer
wraps it) and bf16 (no scaler: the Trainer's own ``optimizer.step()``, guarded). Before the auto-dp
skip strategy, rank 1 skipped alone, rank 0 stepped into the optimizer's reduction, and gloo
aborted the job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed import launch
from helpers import toolkit_python

SCRIPT = Path(__file__).parent / "dist_scripts" / "paddleformers_autodp.py"
VARIABLE = "PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON"


def _run(tmp_path, *args: str) -> list:
    launch(SCRIPT, str(tmp_path), *args, log_dir=tmp_path / "log", timeout=420, python=toolkit_python(VARIABLE, SCRIPT.name))
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, scale", [("float16", 512.0), ("bfloat16", 1.0)])
def test_the_auto_parallel_trainer_skips_rank_1s_inf_on_both_ranks(tmp_path, dtype, scale):
    rank0, rank1 = _run(tmp_path, dtype)
    assert rank0["auto_dp"] is rank1["auto_dp"] is True, "the Trainer turned auto-dp on"
    assert rank0["poisoned"] == [] and rank1["poisoned"] == [["grad", True, "[Replicate(), Replicate()]"]]
    for rank in (rank0, rank1):
        assert rank["error"] is None and rank["steps"] == [1, 2, 3, 4, 5]
        assert rank["skipped"] == 1 and rank["scale"] == scale  # fp16: 1024 halved once
        assert rank["scaler"] == "paddle_amp_ext.scaler" and rank["finite"]
    assert rank0["digest"] == rank1["digest"], "the same weights on both ranks"


@pytest.mark.slow
def test_the_control_without_the_package_lets_the_inf_reach_the_weights(tmp_path):
    rank0, rank1 = _run(tmp_path, "bfloat16", "bare")
    for rank in (rank0, rank1):
        assert rank["error"].startswith("PaddleRecall error(102): LossNan") and not rank["finite"]
