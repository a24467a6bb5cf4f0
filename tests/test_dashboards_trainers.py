"""AmpCallback puts the loss scale, the skipped steps and the grad norm into the real Trainers' own
logs (PaddleFormers on Paddle 3.3.1, PaddleNLP on Paddle 2.6.2), so the Trainer's own report_to
writes them: read back from the Trainer's VisualDL records, equal to the hook's at the same step."""

from __future__ import annotations

import os

import numpy as np
import pytest
from dashboard_readers import read_wandb
from helpers import run_trainer_check

from paddle_amp_ext.dashboards import metrics

KEYS = [m for m in metrics.METRICS if m.trainer_key]


@pytest.fixture(scope="module", params=[("PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "paddleformers"),
                                        ("PADDLE_AMP_EXT_PADDLENLP_PYTHON", "paddlenlp")], ids=lambda p: p[1])
def trainer_logs(request, tmp_path_factory):
    variable, toolkit = request.param
    data, _ = run_trainer_check(variable, "trainer_logs_check.py", tmp_path_factory.mktemp(toolkit))
    assert data["toolkit"] == toolkit
    return data


def test_the_callback_runs_before_the_trainers_reporting_callbacks(trainer_logs):
    order = trainer_logs["order"]
    assert order[0] == "AmpCallback" and order.index("AmpCallback") < order.index("VisualDLCallback")


def test_every_logging_step_carries_the_registrys_trainer_keys(trainer_logs):
    seen = trainer_logs["seen"]
    assert [entry["step"] for entry in seen] == [2, 4, 6]
    assert [entry["loss_scale"] for entry in seen] == [1024.0, 512.0, 512.0]  # step 3's inf halved 1024
    assert [entry["skipped_steps"] for entry in seen] == [0, 1, 1]
    assert all(isinstance(entry["grad_norm"], float) and entry["grad_norm"] > 0 for entry in seen)


def test_the_trainers_own_records_equal_the_hooks_at_the_same_step(trainer_logs):
    own, hook = trainer_logs["trainer_records"], trainer_logs["hook_records"]
    for metric in KEYS:
        series = own[f"train/{metric.trainer_key}"]
        assert [step for step, _ in series] == [2, 4, 6]
        by_step = dict((step + 1, value) for step, value in hook[metric.name])  # the Trainer's step is 1-based
        assert [value for _, value in series] == [by_step[step] for step, _ in series], metric.name


def test_the_hooks_wandb_run_equals_its_visualdl_records(trainer_logs):
    """AmpCallback(report_to=["visualdl", "wandb"]) in the toolkit's venv (no W&B installed there: the
    offline run file is written without it), read here with W&B's own record definitions."""
    pytest.importorskip("wandb")
    (path,) = trainer_logs["hook_wandb"]
    wandb = read_wandb(os.path.dirname(os.path.dirname(os.path.dirname(path))))  # the hook's run directory
    hook = trainer_logs["hook_records"]
    assert set(wandb) == set(hook) and len(hook[metrics.LOSS_SCALE.name]) == 6
    for name, series in hook.items():
        assert str([[step, float(np.float32(value))] for step, value in wandb[name]]) == str(series), name  # NaN too
