"""A real client through ``python -m paddle_amp_ext.run``: PaddleFormers 1.2.0's auto-parallel Trainer
on 2 CPU ranks, from a user script that imports nothing of the package
(``paddleformers_user_script.py``), in PaddleFormers' venv (``PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON``,
built by scripts/test).

The Trainer turns on ``dist.enable_auto_dp()``; no gradient clip, so the skip cannot ride on a
global-norm reduction; an inf in rank 1's own gradient addend at step 3. Before the auto-dp skip
strategy (commit ad97210) rank 1 skipped alone and gloo aborted the job (exit 250) in both cases.
tests/test_paddleformers_autodp.py covers ``amp.route()`` with ``AmpCallback``; this is ``run`` alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed import launch
from helpers import toolkit_python

HERE = Path(__file__).parent
SCRIPT = HERE / "paddleformers_user_script.py"
RUN_MODULE = HERE.parent / "dist_scripts" / "run_module.py"
VARIABLE = "PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON"


def _run(tmp_path: Path, dtype: str, *run_args: str) -> list:
    """The ranks' records, each with the ``--json`` summary ``run`` printed in that rank's log."""
    log_dir = tmp_path / "log"
    launch(RUN_MODULE, "--json", "--no-log", *run_args, str(SCRIPT), str(tmp_path), dtype,
           log_dir=log_dir, timeout=420, python=toolkit_python(VARIABLE, SCRIPT.name))
    ranks = []
    for r in (0, 1):
        record = json.loads((tmp_path / f"rank{r}.json").read_text())
        lines = [line for line in (log_dir / f"workerlog.{r}").read_text().splitlines() if line.startswith('{"script"')]
        record["summary"] = json.loads(lines[-1])
        ranks.append(record)
    return ranks


@pytest.mark.slow
def test_run_emulate_float16_skips_rank_1s_inf_on_both_ranks(tmp_path):
    rank0, rank1 = _run(tmp_path, "float16", "--emulate", "float16")
    assert rank0["poisoned"] == [] and rank1["poisoned"] == ["[Replicate(), Replicate()]"]
    for rank in (rank0, rank1):
        assert rank["auto_dp"] is True and rank["error"] is None and rank["steps"] == [1, 2, 3, 4, 5]
        assert rank["scaler"] == "paddle_amp_ext.scaler" and rank["scale"] == 512.0  # 1024 halved once
        (scaler,) = rank["summary"]["scalers"]
        assert (scaler["steps"], scaler["skipped"]) == (5, 1)
        assert rank["lrs"][2] == rank["lrs"][1] and rank["finite"]  # no scheduler step on the skipped step
    assert rank0["digest"] == rank1["digest"], "the same weights on both ranks"


@pytest.mark.slow
def test_run_bfloat16_the_guard_skips_rank_1s_inf_on_both_ranks(tmp_path):
    rank0, rank1 = _run(tmp_path, "bfloat16")
    for rank in (rank0, rank1):
        assert rank["auto_dp"] is True and rank["error"] is None and rank["steps"] == [1, 2, 3, 4, 5]
        (guard,) = rank["summary"]["guards"]
        assert (guard["steps"], guard["skipped"]) == (5, 1)
        assert rank["summary"]["lr_steps_held"] == 1 and rank["lrs"][2] == rank["lrs"][1] and rank["finite"]
    assert rank0["digest"] == rank1["digest"], "the same weights on both ranks"
