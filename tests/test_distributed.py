"""Data parallel on the CPU (gloo): one skip decision for every rank, and no collective of ours
where DataParallel already made the gradients identical.

With loss scaling on (fp16_emulation) and off (the skip_nonfinite guard); a NaN in one rank's
batch (all-reduced by DataParallel into every rank's gradients) and an inf in one rank's
``no_sync`` gradient (left rank-local by DataParallel); one launch with the agreement on, one
for the control without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from distributed import launch

SCRIPT = Path(__file__).parent / "dist_scripts" / "inf_on_one_rank.py"
pytestmark = pytest.mark.slow


def _launch(tmp_path_factory, sync: bool) -> list:
    out = tmp_path_factory.mktemp("sync" if sync else "nosync")
    launch(SCRIPT, str(out), "1" if sync else "0", log_dir=out / "log")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> list:
    return _launch(tmp_path_factory, sync=True)


@pytest.fixture(scope="module")
def unsynced(tmp_path_factory) -> list:
    return _launch(tmp_path_factory, sync=False)


def _identical(rank0: dict, rank1: dict) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(rank0["params"], rank1["params"]))


@pytest.mark.parametrize("mode,scale", [("on", 512.0), ("off", 1.0)])
def test_nan_in_one_ranks_batch_is_skipped_by_both_without_a_collective(synced, mode, scale):
    """DataParallel's all-reduce carries rank 1's NaN into rank 0's gradients: both skip, with no
    found_inf all-reduce (Paddle's and torch's scalers do none under data parallel either)."""
    rank0, rank1 = synced
    for rank in (rank0, rank1):
        assert rank[f"batch_{mode}"]["skipped"] == [False, True, False]
        assert rank[f"batch_{mode}"]["scale"] == scale
        assert rank[f"batch_{mode}"]["collectives"] == [0, 0, 0]
    assert _identical(rank0[f"batch_{mode}"], rank1[f"batch_{mode}"])


@pytest.mark.parametrize("mode,scale", [("on", 512.0), ("off", 1.0)])
def test_inf_in_one_ranks_no_sync_gradient_is_agreed_by_one_all_reduce(synced, mode, scale):
    rank0, rank1 = synced
    key = f"no_sync_{mode}"
    for rank in (rank0, rank1):
        assert rank[key]["skipped"] == [False, True, False]
        assert rank[key]["scale"] == scale
        assert rank[key]["collectives"] == [1, 1, 1]
    # the synced first layer stays identical; the no_sync layer keeps each rank's own gradients
    assert all(np.array_equal(a, b) for a, b in zip(rank0[key]["params"][:2], rank1[key]["params"][:2]))


@pytest.mark.parametrize("mode", ["on", "off"])
def test_without_the_agreement_ranks_diverge(unsynced, mode):
    """The control: Paddle's behaviour for a rank-local gradient, one rank skips and the other steps."""
    rank0, rank1 = unsynced
    key = f"no_sync_{mode}"
    assert rank0[key]["skipped"] == [False, False, False] and rank1[key]["skipped"] == [False, True, False]
    assert rank0[key]["collectives"] == rank1[key]["collectives"] == [0, 0, 0]
    assert any(not np.array_equal(a, b) for a, b in zip(rank0[key]["params"][:2], rank1[key]["params"][:2]))
