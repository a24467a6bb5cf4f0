"""A suite-shaped trainer (tests/suite_trainer: YAML `AMP:` section, `decorate(level="O2")`, `auto_cast` bound with
`functools.partial` when the trainer is built) run unmodified through `python -m paddle_amp_ext.run`.

Its third batch has NaN (soft) labels: NaN gradients with a finite forward pass. Run plainly, Paddle applies
them; routed, the step is skipped, with and without `--emulate float16`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parent / "suite_trainer"


def _train(tmp_path, name, run_args=()):
    """Run the trainer (through `run` with ``run_args``, plainly for None); (report, run's summary or None)."""
    command = [str(TRAINER / "train.py"), "-c", str(TRAINER / "configs" / "tiny_o2.yml"),
               "-o", f"Global.output_dir={name}"]
    if run_args is not None:
        command = ["-m", "paddle_amp_ext.run", "--json", "--logdir", "runs", *run_args, *command]
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / name / "report.json").read_text())
    summary = json.loads(proc.stdout.strip().splitlines()[-1]) if run_args is not None else None
    return report, summary


@pytest.mark.slow
def test_a_suite_trainer_runs_unmodified_through_run_with_and_without_emulation(tmp_path):
    bare, _ = _train(tmp_path, "bare", None)
    assert not bare["weights_finite"], "the control: Paddle applies the NaN gradients on a CPU"
    assert bare["scaler"] == "paddle.amp.grad_scaler.GradScaler"

    routed, summary = _train(tmp_path, "routed")
    assert routed["scaler"] == "paddle_amp_ext.scaler.GradScaler"
    assert routed["auto_cast"] == "paddle_amp_ext.run.routing", "the partial bound when built is ours"
    assert routed["weights_finite"] and routed["param_dtypes"] == ["paddle.float32"], "O2 on a CPU: float32"
    assert routed["losses"][:2] == bare["losses"][:2], "the same run as Paddle's up to the NaN batch"
    (scaler,) = summary["scalers"]
    assert (summary["exit_code"], scaler["steps"], scaler["skipped"]) == (0, 6, 1)
    assert scaler["loss_scale_min"] == scaler["loss_scale_max"] == 1.0, "loss scaling is off on a CPU"
    assert list((tmp_path / scaler["logdir"]).glob("vdlrecords.*")), "the hook's run directory under --logdir"

    emulated, summary = _train(tmp_path, "emulated", ["--emulate", "float16"])
    (scaler,) = summary["scalers"]
    assert (scaler["steps"], scaler["skipped"]) == (6, 1) and emulated["weights_finite"]
    assert (scaler["loss_scale_max"], scaler["loss_scale_min"]) == (1024.0, 512.0), "AMP.scale_loss, halved once"
    assert emulated["losses"][0] != routed["losses"][0], "the rehearsal rounded the step's ops"

    (tmp_path / "amp.toml").write_text("init_loss_scaling = 4096.0\n")
    _, summary = _train(tmp_path, "configured", ["--emulate", "float16", "--config", "amp.toml"])
    (scaler,) = summary["scalers"]
    assert (scaler["loss_scale_max"], scaler["loss_scale_min"]) == (4096.0, 2048.0), "--config over the YAML"
