"""Auto-parallel (DistTensor) training on the CPU, 2 processes (gloo): one launch per process-group setup.

``dist_scripts/autoparallel_steps.py`` trains a column/row-sharded MLP (``dist.shard_layer``), a
data-parallel one (``Shard(0)`` data, ``Partial`` gradients) and, on 3.x, a ``dist.parallelize``
plan, each through Paddle's own clipped path, the package's ``GradScaler.step(grad_clip=)`` (with
and without ``dist.shard_scaler``), the optimizer's own clip, ``guard_optimizer`` and loss scaling
on (``fp16_emulation``), with a NaN in rank 1's own piece of the first layer's output at step 1.
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
VARIANTS = ("ours", "own_clip", "guard", "shard_scaler") if V3 else ("ours", "own_clip", "guard")
EMULATED = ("emulate", "emulate_shard_scaler") if V3 else ("emulate",)


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
@pytest.mark.parametrize("variant", EMULATED)
def test_loss_scaling_on_unscales_disttensor_gradients_and_every_rank_skips(ranks, layout, variant):
    """Inside fp16_emulation (loss scaling runs on the CPU): the package unscales DistTensor
    gradients itself (Paddle's own ``_unscale`` refuses them) as the CUDA kernel does, also on the
    NaN step, or ``dist.shard_scaler`` does; the NaN step is skipped by both ranks and the scale
    halves on both."""
    rank0, rank1 = (r[layout][variant] for r in ranks)
    print(f"{layout}/{variant}: rel error {rank0['rel']:.3g} (emulate: vs Paddle's float32 path; "
          "emulate_shard_scaler: vs emulate)")
    for rec in (rank0, rank1):
        assert rec["skipped"] == [False, True, False]
        assert rec["scales"] == [1024.0, 512.0, 512.0]
        # the NaN step has finite and non-finite scaled gradients, so the check below can fail there
        assert rec["finite"][1] > 0 and rec["nonfinite"][1] > 0 and rec["nonfinite"][0] == rec["nonfinite"][2] == 0
        if variant == "emulate":  # every finite value divided exactly by the scale, inf/NaN kept, at every step:
            assert rec["unscaled_exactly"] == [True, True, True]  # what the GPU leaves (the CPU kernel zeroed)
        else:  # dist.shard_scaler's own _unscale runs Paddle's kernel for the place: on a CPU, the CPU one
            assert rec["unscaled_exactly"][0] is True and rec["unscaled_exactly"][2] is True
        assert rec["norms"][1] is None and rec["norms"][0] > 0.05  # skipped before the clip
    assert rank0["params"] == rank1["params"] and rank0["norms"] == rank1["norms"]
    if variant == "emulate_shard_scaler":  # dist.shard_scaler's unscale == the package's
        assert rank0["rel"] == 0.0
    else:  # float16-rounded activations against Paddle's float32 path
        assert rank0["rel"] < 1e-6


@pytest.mark.slow
def test_unscale_on_two_ranks_divides_every_gradient_and_every_rank_reads_the_same_flag(tmp_path):
    """The package's DistTensor unscale on its own (no training: runs on 2.6.2 too): a Shard gradient
    stays a shard, a Partial one is reduced first (Replicate, as Paddle's kernel leaves it), every
    value divided as the CUDA kernel divides it (inf/NaN kept, nothing zeroed), and an inf only in
    rank 1's shard or a NaN only in rank 1's addend is found by both ranks (a Partial(MAX) flag,
    one reshard)."""
    launch(SCRIPT.parent / "autoparallel_unscale.py", str(tmp_path), log_dir=tmp_path / "log", timeout=120)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    inf, nan = float("inf"), float("nan")
    partial = {"all_finite": [1.0, 1.75], "shard_inf_rank1": [1.0, 1.75], "partial_nan": [nan, 1.75]}
    rank1_shard = {"all_finite": [3.0, 2.0], "shard_inf_rank1": [inf, 2.0], "partial_nan": [3.0, 2.0]}
    for name, found in (("all_finite", False), ("shard_inf_rank1", True), ("partial_nan", True)):
        for rank, rec in ((0, rank0[name]), (1, rank1[name])):
            assert rec["found"] is found, (name, rank)
            assert rec["flag_placements"] == ["partial"]  # Partial(MAX): one all-reduce when read
            assert rec["placements"] == [["shard"], ["replicate"], ["replicate"]]
            shard, replicated, reduced = (np.array(g) for g in rec["grads"])
            np.testing.assert_array_equal(shard, [0.25, 0.5] if rank == 0 else rank1_shard[name])
            np.testing.assert_array_equal(replicated, [1.0, 2.0])
            np.testing.assert_array_equal(reduced, partial[name])
    third = np.float32(1) / np.float32(3)  # the CUDA kernel's reciprocal, in float32
    for rank, rec in ((0, rank0["scale3"]), (1, rank1["scale3"])):
        assert rec["found"] is False
        shard = [1.0, 2.0] if rank == 0 else [12.0, 8.0]
        expected = [np.float32(shard) * third, np.float32([4.0, 8.0]) * third, np.float32([4.0, 7.0]) * third]
        for got, want in zip(rec["grads"], expected):
            np.testing.assert_array_equal(np.float32(got), want)


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


@pytest.fixture(scope="module")
def rehearsal_ranks(tmp_path_factory) -> list:
    out = tmp_path_factory.mktemp("rehearsal")
    launch(SCRIPT.parent / "autoparallel_rehearsal.py", str(out), log_dir=out / "log", timeout=180)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_rehearsal_finiteness_check_of_a_disttensor_is_its_global_value_on_every_rank(rehearsal_ranks):
    """A NaN in rank 1's own piece only: every rank reads the tensor as not finite (the answer
    decides whether a fix-up runs, and on 2.6.2 those run collectives: one rank alone in one
    aborted gloo). Before the fix the scan read the global shape's count from the local buffer."""
    for rank in rehearsal_ranks:
        assert rank["finite"] == {"S1": ["S1", True], "S0": ["S0", True], "R": ["R", True], "P": ["P", True],
                                  "S1_nan": ["S1", False], "S0_nan": ["S0", False], "P_nan": ["P", False]}


@pytest.mark.slow
def test_rehearsal_rounds_a_disttensor_to_its_global_float16_values_in_its_placements(rehearsal_ranks):
    for rank in rehearsal_ranks:  # [placements of the result, equal to numpy's float16 rounding]
        assert rank["rounded"] == {"S1": ["S1", True], "S0": ["S0", True], "R": ["R", True], "P": ["R", True],
                                   "S1_in_place": ["S1", True], "S0_in_place": ["S0", True],
                                   "R_in_place": ["R", True], "P_in_place": ["R", True]}


@pytest.mark.slow
def test_emulation_of_a_column_sharded_linear_gives_the_dense_emulations_finite_gradients(rehearsal_ranks):
    """``fp16_emulation`` with nothing black-listed (the rehearsal's rounding on every op) of a
    ``Shard(1)`` Linear: the gradients are finite, those of the same dense model's emulation
    exactly, and Paddle's float32 ones within the float16 rounding (2**-7 of the largest, about
    16 roundings' worth). Before the fix they were non-finite (2.6.2) or the heap was corrupted."""
    for rank in rehearsal_ranks:
        grads = rank["grads"]
        assert grads["emulated_placements"] == grads["float32_placements"] == ["S1", "S0", "R", "R"]
        for emulated, dense, float32 in zip(grads["emulated"], grads["dense_emulated"], grads["float32"]):
            emulated, float32 = np.asarray(emulated), np.asarray(float32)
            assert np.isfinite(emulated).all()
            np.testing.assert_array_equal(emulated, dense)
            np.testing.assert_allclose(emulated, float32, rtol=0, atol=2**-7 * np.abs(float32).max())
            assert not np.array_equal(emulated, float32)  # rounded: the emulation ran
    assert rehearsal_ranks[0]["grads"] == rehearsal_ranks[1]["grads"]


@pytest.mark.slow
def test_run_routes_an_unmodified_auto_parallel_script(tmp_path):
    """``python -m paddle_amp_ext.run`` in each worker of a launch: the script's ``paddle.amp.GradScaler``
    (inside ``dist.shard_scaler`` on 3.x) is the package's, with a default process group; every
    rank skips the NaN step; the VisualDL hook writes on rank 0 only. With ``--emulate float16``
    (loss scaling runs; its rehearsal of the column-sharded Linear, on both versions)."""
    launch(SCRIPT.parent / "run_module.py", "--json", "--emulate", "float16", "--logdir", str(tmp_path / "vdl"),
           str(SCRIPT.parent / "autoparallel_user_script.py"), str(tmp_path), log_dir=tmp_path / "log", timeout=180)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    summaries = []
    for r in (0, 1):
        lines = [line for line in (tmp_path / "log" / f"workerlog.{r}").read_text().splitlines()
                 if line.startswith('{"script"')]
        summaries.append(json.loads(lines[-1])["scalers"])
    for rank, scalers in zip(ranks, summaries):
        assert rank["scaler"] == "paddle_amp_ext.scaler"
        assert rank["found"] == [False, True, False]
        assert rank["scale"] == [512.0]  # halved by the skipped step
        assert len(scalers) == 1 and scalers[0]["steps"] == 3 and scalers[0]["skipped"] == 1
    assert ranks[0]["params"] == ranks[1]["params"]
    assert summaries[1][0]["logdir"] is None
    assert list(Path(summaries[0][0]["logdir"]).glob("vdlrecords.*"))
