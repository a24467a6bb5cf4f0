"""Data parallel on the CPU (gloo): found_inf is agreed, so ranks cannot diverge.

With loss scaling on (fp16_emulation) and off (the skip_nonfinite guard), one launch each for
the agreed flag and for the control without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from distributed import launch

SCRIPT = Path(__file__).parent / "dist_scripts" / "inf_on_one_rank.py"


def run(tmp_path: Path, sync: bool) -> list:
    out = tmp_path / ("sync" if sync else "nosync")
    out.mkdir()
    launch(SCRIPT, str(out), "1" if sync else "0", log_dir=out / "log")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_inf_on_one_rank_skips_on_both_and_parameters_stay_identical(tmp_path):
    rank0, rank1 = run(tmp_path, sync=True)
    for mode, scale in (("on", 512.0), ("off", 1.0)):
        assert rank0[mode]["skipped"] == rank1[mode]["skipped"] == [False, True, False], mode
        assert rank0[mode]["scale"] == rank1[mode]["scale"] == scale
        for a, b in zip(rank0[mode]["params"], rank1[mode]["params"]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_without_the_agreement_ranks_diverge(tmp_path):
    """The control: Paddle's behaviour, one rank skips and the other steps."""
    rank0, rank1 = run(tmp_path, sync=False)
    for mode in ("on", "off"):
        assert rank0[mode]["skipped"] == [False, False, False] and rank1[mode]["skipped"] == [False, True, False]
        assert any(not np.array_equal(a, b) for a, b in zip(rank0[mode]["params"], rank1[mode]["params"]))
