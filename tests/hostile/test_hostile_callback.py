"""AmpCallback and a guard the user installed: used as it is, left in place at train end.

Runs in the toolkit venvs (PaddleFormers on Paddle 3.3.1, PaddleNLP on Paddle 2.6.2), whose
``TrainerCallback`` the callback subclasses; skipped where the venv's variable is not set.
"""

from __future__ import annotations

import pytest
from helpers import run_trainer_check


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "PADDLE_AMP_EXT_PADDLENLP_PYTHON"])
def test_a_users_guard_is_used_and_left_in_place_the_callbacks_own_removed(variable, tmp_path):
    report, _ = run_trainer_check(variable, "child_scripts/callback_user_guard.py", tmp_path)
    for training in report["user"]["trainings"]:
        assert training["is_users"] and training["hooks"] == 1
        assert training["active_after"] and training["step_replaced_after"]  # the user's guard stays
        assert training["hooks_after"] == 0 and not training["scheduler_held_after"]  # what the callback added goes
    assert [t["skipped"] for t in report["user"]["trainings"]] == [2, 4]
    assert [t["last_epoch"] for t in report["user"]["trainings"]] == [0, 0], "the schedule held on skipped steps"
    assert report["user"]["settings_kept"] == [3, "warn"]
    for training in report["own"]["trainings"]:
        assert not training["is_users"] and training["hooks"] == 1 and training["skipped"] == 2
        assert not training["active_after"] and not training["step_replaced_after"]
        assert not training["scheduler_held_after"]
