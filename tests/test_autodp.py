"""Auto-dp (``dist.enable_auto_dp()``, Paddle 3.x; 2.6.2 has none): 2 processes on the CPU (gloo).

``dist_scripts/autodp_steps.py`` trains a replicated MLP with each rank's own batch, so each
rank's gradient is its own addend labelled ``Replicate`` until the optimizer's step relabels it
``Partial``; a NaN in rank 1's gradient only at step 1. Before the auto-dp skip strategy, rank 1
skipped alone, rank 0 stepped into the optimizer's reduction, and gloo aborted the job.
"""

from __future__ import annotations

import json
from pathlib import Path

import paddle.distributed as dist
import pytest
from distributed import launch

SCRIPT = Path(__file__).parent / "dist_scripts" / "autodp_steps.py"
VARIANTS = ("off", "off_clip", "own_clip", "emulate", "emulate_clip", "guard", "guard_clip", "shard_scaler",
            "emulate_shard_scaler")

pytestmark = pytest.mark.skipif(not hasattr(dist, "enable_auto_dp"),
                                reason="this Paddle has no dist.enable_auto_dp (2.6.2): no auto-dp layout")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("autodp")
    launch(SCRIPT, str(out), log_dir=out / "log", timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rank_skips_the_step_only_rank_1_saw_nan_and_weights_equal_paddles(ranks, variant):
    rank0, rank1 = (r[variant] for r in ranks)
    assert rank0["skipped"] == rank1["skipped"] == [False, True, False]
    expected = [1024.0, 512.0, 512.0] if variant.startswith("emulate") else [1.0, 1.0, 1.0]
    assert rank0["scales"] == rank1["scales"] == expected
    assert rank0["params"] == rank1["params"]
    assert rank0["rel"] == rank1["rel"] == 0.0  # Paddle's own path on the two finite steps, bit for bit
