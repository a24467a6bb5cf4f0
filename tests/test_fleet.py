"""Fleet on the CPU (gloo, ``fleet.init(is_collective=True)`` with hybrid configs), real launches.

One launch per hybrid config, each running several scenarios (tests/dist_scripts/fleet_*.py):
sharding stage 1 (2 ranks), dp x sharding (4 ranks), tensor parallel (mp_degree=2, shards
marked ``is_distributed``), pipeline parallel (pp_degree=2, through Paddle's own
``PipelineParallel._optimizer_step``), and stage 3's contract. Every launch has a hard timeout
(tests/distributed.py): a hang fails instead of stalling the suite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from distributed import launch

SCRIPTS = Path(__file__).parent / "dist_scripts"
NAN_SCENARIOS = [("nan_off", 1.0), ("nan_on", 512.0), ("nan_on_fleet_scaler", 512.0)]
pytestmark = pytest.mark.slow


def _launch(tmp_path_factory, name: str, script: str, *args: str, nproc: int = 2) -> list:
    out = tmp_path_factory.mktemp(name)
    launch(SCRIPTS / script, str(out), *args, log_dir=out / "log", nproc=nproc)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def sharding(tmp_path_factory):
    return _launch(tmp_path_factory, "sharding", "fleet_sharding.py", "1", "2")


@pytest.fixture(scope="module")
def dp_sharding(tmp_path_factory):
    return _launch(tmp_path_factory, "dp_sharding", "fleet_sharding.py", "2", "2", nproc=4)


@pytest.fixture(scope="module")
def tensor(tmp_path_factory):
    return _launch(tmp_path_factory, "mp", "fleet_tensor_pipeline.py", "mp")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return _launch(tmp_path_factory, "pp", "fleet_tensor_pipeline.py", "pp")


def _flat(grads: list) -> np.ndarray:
    return np.concatenate([np.asarray(g, dtype=np.float64) for g in grads])


def _assert_close_params(ours: list, paddle: list) -> None:
    for a, b in zip(ours, paddle):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _assert_same_on_every_rank(ranks: list, key: str) -> None:
    for other in ranks[1:]:
        for a, b in zip(ranks[0][key]["params"], other[key]["params"]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("config", ["sharding", "dp_sharding", "tensor", "pipeline"])
@pytest.mark.parametrize("scenario,scale", NAN_SCENARIOS)
def test_nan_on_one_rank_every_rank_skips_the_same_step(config, scenario, scale, request):
    ranks = request.getfixturevalue(config)
    for rank in ranks:
        assert rank[scenario]["skipped"] == [False, True, False]
        assert rank[scenario]["scale"] == scale
        assert rank[scenario]["hook"] == [[False, None], [True, None], [False, None]]
    if config in ("sharding", "dp_sharding"):  # every rank holds every parameter
        _assert_same_on_every_rank(ranks, scenario)


@pytest.mark.parametrize("config", ["sharding", "dp_sharding"])
@pytest.mark.parametrize("scenario", ["nan_clip_off", "nan_own_clip_off"])
def test_nan_with_a_global_norm_clip_is_decided_by_the_reduced_norm(config, scenario, request):
    """No found_inf all-reduce: the clip's reduced global norm is NaN on every rank, so every rank
    skips the same step, and the hook sees that norm."""
    ranks = request.getfixturevalue(config)
    for rank in ranks:
        assert rank[scenario]["skipped"] == [False, True, False]
        (ok0, norm0), (bad, nan), (ok2, norm2) = rank[scenario]["hook"]
        assert (ok0, bad, ok2) == (False, True, False)
        assert math.isnan(nan) and norm0 > 1.0 and norm2 > 1.0
        assert (norm0, norm2) == tuple(ranks[0][scenario]["hook"][i][1] for i in (0, 2))
    _assert_same_on_every_rank(ranks, scenario)


@pytest.mark.parametrize("config", ["sharding", "dp_sharding"])
@pytest.mark.parametrize("scenario", ["nan_on_clip", "nan_on_fleet_scaler_clip", "nan_on_own_clip"])
def test_loss_scaled_overflow_is_decided_by_the_reduced_norm_one_collective_fewer(config, scenario, request):
    """Loss scaling on (fp16_emulation) with a global-norm clip: the unscaled gradients' reduced
    norm is NaN on every rank at the overflow step, so every rank skips it and halves the scale
    with no found_inf all-reduce (also through fleet.distributed_scaler, whose own unscale would
    all-reduce): each step calls as many collectives as Paddle's unscaled clipped step, one fewer
    than Paddle's loss-scaled one (its scaler's found_inf all-reduce, then the same step)."""
    ranks = request.getfixturevalue(config)
    for rank in ranks:
        rec = rank[scenario]
        assert rec["skipped"] == [False, True, False]
        assert rec["scale"] == 512.0
        (ok0, norm0), (bad, nan), (ok2, norm2) = rec["hook"]
        assert (ok0, bad, ok2) == (False, True, False)
        assert math.isnan(nan) and norm0 > 1.0 and norm2 > 1.0
        assert (norm0, norm2) == tuple(ranks[0][scenario]["hook"][i][1] for i in (0, 2))
        # the norm of the unscaled gradients: the float32 run's, up to the rehearsal's float16 rounding
        np.testing.assert_allclose(norm0, rank["nan_clip_off"]["hook"][0][1], rtol=2e-2)
        paddles = rank["paddle_clip"]["collectives"]
        assert rec["collectives"] == paddles and paddles[0] > 0, (rec["collectives"], paddles)
        assert rank["paddle_scaled_clip"]["collectives"] == [n + 1 for n in paddles]
    _assert_same_on_every_rank(ranks, scenario)
    for a, b in zip(ranks[0][scenario]["params"], ranks[0]["nan_on_clip"]["params"]):  # one arithmetic
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("config", ["sharding", "dp_sharding"])
def test_sharding_clip_is_paddles_hybrid_clip_with_the_global_norm(config, request):
    ranks = request.getfixturevalue(config)
    for step in range(3):  # the gradient the optimizer applies: the mean of the ranks' gradients
        reduced = sum(_flat(r["ours_clip"]["grads"][step]) for r in ranks) / len(ranks)
        for rank in ranks:
            assert rank["ours_clip"]["norms"][step] == ranks[0]["ours_clip"]["norms"][step]
            np.testing.assert_allclose(rank["ours_clip"]["norms"][step], np.linalg.norm(reduced), rtol=1e-6)
    assert ranks[0]["ours_clip"]["norms"][0] > 1.0  # the clip really scaled the gradients
    for rank in ranks:
        _assert_close_params(rank["ours_clip"]["params"], rank["paddle_clip"]["params"])
        _assert_close_params(rank["ours_record"]["params"], rank["paddle_clip"]["params"])
        assert rank["ours_record"]["norms"] == rank["ours_clip"]["norms"]
        assert rank["ours_clip"]["hook"] == [[False, n] for n in rank["ours_clip"]["norms"]]
    _assert_same_on_every_rank(ranks, "ours_clip")


@pytest.mark.parametrize("config", ["sharding", "dp_sharding"])
def test_sharding_clip_of_chosen_parameters_is_paddles_need_clip(config, request):
    """step(parameters=...) clips and measures those only, as Paddle's path with need_clip=False
    on the others."""
    ranks = request.getfixturevalue(config)
    for step in range(3):
        reduced = sum(_flat(r["ours_clip_subset"]["grads"][step][:2]) for r in ranks) / len(ranks)
        for rank in ranks:
            np.testing.assert_allclose(rank["ours_clip_subset"]["norms"][step], np.linalg.norm(reduced), rtol=1e-6)
    for rank in ranks:
        _assert_close_params(rank["ours_clip_subset"]["params"], rank["paddle_clip_subset"]["params"])
    assert any(not np.allclose(a, b) for a, b in zip(ranks[0]["ours_clip_subset"]["params"],
                                                      ranks[0]["ours_clip"]["params"]))


def _sharded_norms(ranks: list, key: str, shard: slice, replicated_from: int) -> list:
    """sqrt(sum over ranks of each rank's shard squares + the replicated squares once)."""
    norms = []
    for step in range(3):
        squares = sum(np.sum(_flat(r[key]["grads"][step][shard]) ** 2) for r in ranks)
        squares += np.sum(_flat(ranks[replicated_from][key]["grads"][step][2:]) ** 2)
        norms.append(float(np.sqrt(squares)))
    return norms


def test_tensor_parallel_clip_counts_every_shard_and_replicated_weights_once(tensor):
    expected = _sharded_norms(tensor, "paddle_clip", slice(0, 2), replicated_from=0)
    for rank in tensor:
        for key in ("ours_clip", "ours_record"):
            np.testing.assert_allclose(rank[key]["norms"], expected, rtol=1e-6)
            _assert_close_params(rank[key]["params"], rank["paddle_clip"]["params"])
    for a, b in zip(tensor[0]["ours_clip"]["params"][2:], tensor[1]["ours_clip"]["params"][2:]):
        np.testing.assert_array_equal(a, b)  # the replicated weights stay identical across mp ranks


def test_pipeline_step_through_paddles_optimizer_step_reports_the_global_norm(pipeline):
    expected = _sharded_norms(pipeline, "paddle_clip", slice(0, 2), replicated_from=1)  # the head: stage 1
    for rank in pipeline:
        np.testing.assert_allclose(rank["ours_record"]["norms"], expected, rtol=1e-6)
        _assert_close_params(rank["ours_record"]["params"], rank["paddle_clip"]["params"])


def test_stage3_contract_norm_over_slices_and_every_rank_skips(sharding):
    """Stage 3's optimizer markers and Paddle's own GroupShardedScaler (Paddle refuses stage 3 on
    a CPU): the norm sums the ranks' slices and counts unsliced parameters once, each rank's
    slice is clipped by it, and a NaN on one rank is skipped by both with one reduce."""
    expected = _sharded_norms([r["stage3"] for r in sharding], "clip", slice(0, 2), replicated_from=0)
    for rank in sharding:
        run = rank["stage3"]["clip"]
        np.testing.assert_allclose(run["norms"], expected, rtol=1e-6)
        weights = [np.asarray(p, dtype=np.float64) for p in run["params0"]]
        for step, norm in enumerate(expected):  # SGD(0.1) on the gradients clipped to norm 1
            coef = 1.0 / max(norm, 1.0)
            weights = [w - 0.1 * coef * np.asarray(g) for w, g in zip(weights, run["grads"][step])]
        for final, want in zip(run["params"], weights):
            np.testing.assert_allclose(final, want, rtol=1e-5, atol=1e-6)
        assert rank["stage3"]["nan_on"]["skipped"] == [False, True, False]
        assert rank["stage3"]["nan_on"]["scale"] == 512.0


def test_unscale_by_hand_then_step_unscales_once_under_group_sharded_scaler(sharding):
    """GroupShardedScaler's ``_unscale`` leaves Paddle's optimizer state alone; ``step()`` must
    not divide the gradients by the scale a second time."""
    for rank in sharding:
        run = rank["stage3"]["unscale_then_step"]
        for before, grad, after in zip(run["params0"], run["grads"], run["params"]):
            np.testing.assert_allclose(after, np.asarray(before) - 0.1 * np.asarray(grad), rtol=1e-5, atol=1e-6)
