"""Auto-parallel (DistTensor) training on the CPU, 2 processes (gloo): one launch per process-group setup.

``dist_scripts/autoparallel_steps.py`` trains a column/row-sharded MLP (``dist.shard_layer``), a
data-parallel one (``Shard(0)`` data, ``Partial`` gradients) and, on 3.x, a ``dist.parallelize``
plan, each through Paddle's own clipped path, the package's ``GradScaler.step(grad_clip=)`` (with
and without ``dist.shard_scaler``) and ``guard_optimizer``, with a NaN loss on rank 1 only at step 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import paddle.distributed as dist
import pytest
from distributed import launch

SCRIPT = Path(__file__).parent / "dist_scripts" / "autoparallel_steps.py"
V3 = hasattr(dist, "shard_scaler")  # 2.6.2 has no shard_scaler, parallelize, shard_dataloader
LAYOUTS = ("mp", "dp", "plan") if V3 else ("mp", "dp")
VARIANTS = ("ours", "guard", "shard_scaler") if V3 else ("ours", "guard")


@pytest.fixture(scope="module", params=["init_parallel_env", "no_process_group"])
def ranks(request, tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp(request.param)
    launch(SCRIPT, str(out), "1" if request.param == "init_parallel_env" else "0", log_dir=out / "log", timeout=240)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_nan_on_one_rank_both_skip_and_weights_equal_paddles_clip(ranks, layout, variant):
    rank0, rank1 = (r[layout][variant] for r in ranks)
    print(f"{layout}/{variant}: rel error vs Paddle's ClipGradByGlobalNorm path {rank0['rel']:.3g}, {rank1['rel']:.3g}")
    assert rank0["skipped"] == rank1["skipped"] == [False, True, False]
    assert rank0["rel"] == rank1["rel"] == 0.0
    assert rank0["params"] == rank1["params"]
    norms0, norms1 = rank0["norms"], rank1["norms"]
    assert all(_same(a, b) for a, b in zip(norms0, norms1)), (norms0, norms1)  # the global norm, on every rank
    assert math.isnan(norms0[1]) and norms0[0] > 0.05 and norms0[2] > 0.05  # clipped (CLIP = 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_visualdl_records_on_rank_0_only_with_rank_0s_own_loss(ranks, layout):
    visualdl = pytest.importorskip("visualdl")
    rank0, rank1 = (r[layout]["ours"] for r in ranks)
    assert rank1["logdir"] is None
    files = list(Path(rank0["logdir"]).glob("vdlrecords.*"))
    assert len(files) == 1, files
    reader = visualdl.LogReader(file_path=str(files[0]))
    data = {tag: [d.value for d in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]}
    assert set(data) == {"amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/grad_norm",
                         "amp/lr"}
    np.testing.assert_allclose(data["amp/loss"], rank0["losses"], rtol=1e-6)  # rank 0's own (local) loss
    np.testing.assert_allclose(data["amp/grad_norm"], rank0["norms"], rtol=1e-6, equal_nan=True)
    assert data["amp/skipped_steps"] == [0.0, 1.0, 1.0]
    if layout == "dp":  # Partial(AVG) loss: the two ranks' own losses differ (their own halves of the batch)
        assert rank0["losses"][0] != rank1["losses"][0]
    else:  # Replicate loss: the global one, on every rank
        assert rank0["losses"][0] == rank1["losses"][0]
