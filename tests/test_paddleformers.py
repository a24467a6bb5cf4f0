"""The real PaddleFormers Trainer (paddleformers 1.2.0, Paddle 3.3.1) with paddle_amp_ext routed in.

`scripts/test` builds `.venv-paddleformers` with the pins in tests/requirements-paddleformers.txt and
points PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON at it; the Trainer runs there
(tests/paddleformers_trainer_check.py) with its default `amp_master_grad=True`: fp16 under rehearsal
with an inf injected into the master gradients at optimizer steps 2 and 5, and bf16 with a NaN at
step 2; and bf16 under routing alone (no AmpCallback), guarded by the routing.
"""

from __future__ import annotations

import glob
import math
import os

import pytest
from helpers import run_trainer_check


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paddleformers")
    return (*run_trainer_check("PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "paddleformers_trainer_check.py", out), out)


def _scalars(logging_dir, tag):
    from visualdl import LogReader

    (ours,) = glob.glob(os.path.join(logging_dir, "*", "vdlrecords.*"))
    reader = LogReader(file_path=ours)
    return set(reader.get_tags()["scalar"]), [(d.id, d.value) for d in reader.get_data("scalar", tag)]


@pytest.mark.slow
def test_fp16_with_master_gradients_sees_every_skipped_step_and_holds_the_lr_schedule(trainer_run):
    run, log, _ = trainer_run
    fp16 = run["fp16"]
    assert fp16["poisoned"] == ["main_grad", "main_grad"], "the gradients are the float32 master gradients"
    assert [s["step"] for s in fp16["seen"]] == list(range(1, 9))
    assert [s["last_epoch"] for s in fp16["seen"]] == [1, 1, 2, 3, 3, 4, 5, 6], "no scheduler step on steps 2 and 5"
    assert fp16["seen"][1]["lr"] == fp16["seen"][0]["lr"] and fp16["seen"][4]["lr"] == fp16["seen"][3]["lr"]
    assert fp16["skipped"] == 2 and fp16["scale"] == 2.0**10 / 4 and fp16["finite"]
    assert log.count("optimizer not run, scale_before: 1024.0, scale_after: 512.0") == 2, "whole and half runs"
    assert log.count("optimizer not run, scale_before: 512.0, scale_after: 256.0") == 2, "whole and resumed runs"


@pytest.mark.slow
def test_fp16_resume_from_checkpoint_reproduces_the_uninterrupted_run(trainer_run):
    fp16 = trainer_run[0]["fp16"]
    assert fp16["seen_resumed"] == fp16["seen"][4:]
    assert fp16["max_param_diff"] == 0.0
    assert fp16["scale_resumed"] == fp16["scale"] and fp16["skipped_resumed"] == fp16["skipped"]


@pytest.mark.slow
def test_bf16_the_guard_keeps_a_nan_gradient_out_of_the_weights_and_counts_the_skip(trainer_run):
    bf16 = trainer_run[0]["bf16"]
    assert bf16["poisoned"] == ["main_grad"]
    assert bf16["unguarded"].startswith("PaddleRecall error(102): LossNan"), "the control: NaN weights, NaN loss"
    assert bf16["finite"] and bf16["guard_skipped"] == 1
    assert bf16["guard_active"], "the guard is the routing's (put on the optimizer as it was built): it stays"
    assert [s["last_epoch"] for s in bf16["seen"]] == [1, 1, 2, 3], "the LR holds on the skipped step"
    tags, skips = _scalars(bf16["logging_dir"], "amp/skipped_steps")
    assert {"amp/log2_loss_scale", "amp/skipped_steps", "amp/grad_norm", "amp/lr"} <= tags
    assert skips == [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.0)]


@pytest.mark.slow
def test_amp_tags_sit_next_to_the_trainers_visualdl_logs(trainer_run):
    fp16 = trainer_run[0]["fp16"]
    logging_dir = os.path.join(trainer_run[2], fp16["logging_dir"])
    assert glob.glob(os.path.join(logging_dir, "vdlrecords.*")), "the Trainer's own records"
    tags, skips = _scalars(logging_dir, "amp/skipped_steps")
    assert {"amp/loss", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"} <= tags, "the PaddleNLP test's tags"
    assert skips == [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0), (6, 2.0), (7, 2.0)]


@pytest.mark.slow
def test_every_tag_has_every_step_the_first_loss_included(trainer_run):
    """The hook is attached when training begins, before the first step's scale(); the lr is logged
    on the skipped steps too."""
    logging_dir = os.path.join(trainer_run[2], trainer_run[0]["fp16"]["logging_dir"])
    for tag in ("amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"):
        _, points = _scalars(logging_dir, tag)
        assert [step for step, _ in points] == list(range(8)), tag
        assert all(math.isfinite(value) for _, value in points), (tag, points)


@pytest.mark.slow
def test_bf16_under_routing_alone_is_guarded_and_its_lr_held(trainer_run):
    """No AmpCallback: the routing guards the optimizer the Trainer builds, and holds the Trainer's own
    lr_scheduler.step() after the skipped step (the Trainer's bf16 path has no scaler to hold it)."""
    alone = trainer_run[0]["bf16_routed"]
    assert alone["poisoned"] == ["main_grad"] and alone["finite"] and alone["global_step"] == 4
    assert (alone["guard_skipped"], alone["lr_steps_held"]) == (1, 1)
    assert [s["last_epoch"] for s in alone["seen"]] == [1, 1, 2, 3], "the same hold as with AmpCallback"
