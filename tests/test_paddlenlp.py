"""The real PaddleNLP Trainer (paddlenlp 2.8.1, Paddle 2.6.2) with paddle_amp_ext routed in.

`scripts/test` builds `.venv-paddlenlp` with the pins PaddleNLP 2.8.1 needs today and points
PADDLE_AMP_EXT_PADDLENLP_PYTHON at it; the Trainer runs there (tests/paddlenlp_trainer_check.py)
under fp16 rehearsal with an injected overflow at optimizer steps 2 and 5.
"""

from __future__ import annotations

import glob
import math
import os
import subprocess
from pathlib import Path

import pytest
from helpers import run_trainer_check

PYTHON = os.environ.get("PADDLE_AMP_EXT_PADDLENLP_PYTHON")


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    return run_trainer_check("PADDLE_AMP_EXT_PADDLENLP_PYTHON", "paddlenlp_trainer_check.py",
                             tmp_path_factory.mktemp("paddlenlp"))


@pytest.mark.slow
def test_trainer_sees_every_skipped_step_and_holds_the_lr_schedule(trainer_run):
    run, log = trainer_run
    assert [s["step"] for s in run["seen"]] == list(range(1, 9))
    assert [s["last_epoch"] for s in run["seen"]] == [1, 1, 2, 3, 3, 4, 5, 6], "no scheduler step on steps 2 and 5"
    assert run["seen"][1]["lr"] == run["seen"][0]["lr"] and run["seen"][4]["lr"] == run["seen"][3]["lr"]
    assert run["skipped"] == 2 and run["scale"] == 2.0**10 / 4
    assert log.count("optimizer not run") >= 2, "the Trainer's own message for a skipped step"


@pytest.mark.slow
def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(trainer_run):
    run, _ = trainer_run
    assert run["seen_resumed"] == run["seen"][4:]
    assert run["max_param_diff"] == 0.0
    assert run["scale_resumed"] == run["scale"] and run["skipped_resumed"] == run["skipped"]


@pytest.mark.slow
def test_amp_tags_sit_next_to_the_trainers_visualdl_logs(trainer_run):
    from visualdl import LogReader

    run, _ = trainer_run
    logging_dir = run["logging_dir"]
    assert glob.glob(os.path.join(logging_dir, "vdlrecords.*")), "the Trainer's own records"
    (ours,) = glob.glob(os.path.join(logging_dir, "*", "vdlrecords.*"))
    reader = LogReader(file_path=ours)
    tags = set(reader.get_tags()["scalar"])
    assert {"amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"} <= tags
    skips = [(d.id, d.value) for d in reader.get_data("scalar", "amp/skipped_steps")]
    assert skips == [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0), (6, 2.0), (7, 2.0)]
    scales = [(d.id, d.value) for d in reader.get_data("scalar", "amp/loss_scale")]  # the raw scale, halved per skip
    assert scales == [(0, 1024.0), (1, 1024.0), (2, 512.0), (3, 512.0), (4, 512.0), (5, 256.0), (6, 256.0), (7, 256.0)]


@pytest.mark.slow
def test_every_tag_has_every_step_the_first_loss_included(trainer_run):
    """The hook is attached when training begins, before the first step's scale(); the lr is logged
    on the skipped steps too."""
    from visualdl import LogReader

    (ours,) = glob.glob(os.path.join(trainer_run[0]["logging_dir"], "*", "vdlrecords.*"))
    reader = LogReader(file_path=ours)
    for tag in ("amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps", "amp/lr"):
        points = [(d.id, d.value) for d in reader.get_data("scalar", tag)]
        assert [step for step, _ in points] == list(range(8)), tag
        assert all(math.isfinite(value) for _, value in points), (tag, points)


@pytest.mark.slow
def test_the_paddlenlp_example_runs_as_written(tmp_path):
    if not PYTHON:
        pytest.skip("PADDLE_AMP_EXT_PADDLENLP_PYTHON is not set (bash scripts/test builds .venv-paddlenlp)")
    example = Path(__file__).resolve().parent.parent / "examples" / "train_paddlenlp.py"
    proc = subprocess.run([PYTHON, str(example), "--output-dir", "runs/nlp", "--max-steps", "4"], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "GradScaler: paddle_amp_ext.scaler, skipped steps 0, loss scale 1024" in proc.stdout
    assert glob.glob(str(tmp_path / "runs/nlp/vdl/*/vdlrecords.*"))
