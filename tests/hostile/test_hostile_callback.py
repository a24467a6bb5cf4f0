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


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["PADDLE_AMP_EXT_PADDLEFORMERS_PYTHON", "PADDLE_AMP_EXT_PADDLENLP_PYTHON"])
def test_the_callbacks_lr_hold_puts_nothing_on_the_scheduler_and_ends_with_its_training(variable, tmp_path):
    """The hold is lrhold's (the guard notes each step): during training the scheduler object is
    what it is without the package (vars, pickle, copies, a state dict of every attribute); each
    hold ends with its own training, or with the callback when train end never comes; two
    trainings overlapping (one thread or two) and a fork each end only their own."""
    report, _ = run_trainer_check(variable, "child_scripts/callback_lr_hold.py", tmp_path)
    during = report["the_object_during_and_after_training"]
    assert during == {"vars_during": True, "pickle_during": [1, True], "copy_during": [1, 0],
                      "deepcopy_during": [1, 0], "state_dict_during": True, "epochs": [0, 1, 1, 2], "held": 2,
                      "skipped": 2, "vars_after": True, "restored_after": True}
    assert report["train_end_never_comes"] == {"first": [0, 0], "second": [0, 1], "active_then": True,
                                               "restored_once_collected": True, "last_epoch": 2}
    assert report["two_trainers_in_one_thread"] == {"one": [0], "two": [0, 0], "active_after_one": True,
                                                    "restored": True}
    assert report["two_trainers_in_two_threads"] == {"epochs": [[0, 1, 1, 1, 2]] * 2, "errors": [], "held": [3, 3],
                                                     "restored": True}
    assert report["a_fork_during_training"] == {"child": {"epochs": [1, 2], "restored": True}, "parent": [1, 2],
                                                "restored": True}
