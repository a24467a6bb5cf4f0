"""Suite-shaped scripts (tests/suite_scripts, own code) run unmodified through `python -m paddle_amp_ext.run`.

- seg_style.py: PaddleSeg 2.8.0's loop: hard-coded lists with the GPU-only `sync_batch_norm`,
  `scaler.minimize(optimizer, scaled)`, its own `lr.step()` after every iteration.
- det_style.py: PaddleDetection 2.6's Trainer: YAML-ish AMP keys, `auto_cast(enable=use_gpu,
  custom_white_list=..., custom_black_list=..., level=...)`, `GradScaler(enable=use_gpu)`,
  `minimize`, a warmup scheduler stepped by the trainer.
- ocr_style.py: PaddleOCR's loop: a SIGINT/SIGTERM handler that SIGKILLs its process group,
  installed first; `Global.amp_*` keys; `minimize`; its own `lr_scheduler.step()`.

Each script runs plainly and under `run` with the same exit code, losses and final weights when
nothing overflows; under `run --emulate float16` the input of step 3 overflows float16 and the
skipped step is in the `--json` summary. Every child gets its own session (the OCR handler kills
its whole process group) and a timeout.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "suite_scripts"
RUN = ["-m", "paddle_amp_ext.run", "--json", "--logdir", "runs"]
STYLES = ["seg_style", "det_style", "ocr_style"]
STEPS = 6
#: what turns AMP on where the trainer reads it from its config (PaddleDetection: only with use_gpu)
AMP_ON = {"det_style": ["-o", "use_gpu=true"]}


def _script(tmp_path, style, out, *args, run_args=None):
    """Run ``style`` plainly (run_args None) or through `run` with ``run_args``; (exit code, report, summary)."""
    command = [str(SCRIPTS / f"{style}.py"), "--out", out, "--steps", str(STEPS), *args]
    if run_args is not None:
        command = [*RUN, *run_args, *command]
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / out / "report.json").read_text())
    summary = json.loads(proc.stdout.strip().splitlines()[-1]) if run_args is not None else None
    return proc.returncode, report, summary


#: how each kind of run is made: (script arguments, `run` arguments or None for a plain run)
KINDS = {"bare": ((), None), "routed": ((), []), "emulated": (("--overflow-step", "3"), ["--emulate", "float16"])}


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """``suite_run(style, kind)``: (folder, exit code, report, summary) of one run, made once per module."""
    made = {}

    def get(style, kind):
        if (style, kind) not in made:
            folder = tmp_path_factory.mktemp(f"{style}-{kind}")
            args, run_args = KINDS[kind]
            if kind == "emulated":
                args = (*args, *AMP_ON.get(style, []))
            made[style, kind] = (folder, *_script(folder, style, "out", *args, run_args=run_args))
        return made[style, kind]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_a_suite_shaped_script_runs_the_same_plainly_and_under_run(suite_run, style):
    _, code, bare, _ = suite_run(style, "bare")
    _, routed_code, routed, summary = suite_run(style, "routed")
    assert routed_code == code == summary["exit_code"] == 0
    assert bare["scaler"] == "paddle.amp.grad_scaler.GradScaler"
    assert routed["scaler"] == "paddle_amp_ext.scaler.GradScaler"
    assert routed["losses"] == bare["losses"] and len(bare["losses"]) == STEPS
    assert routed["weights"] == bare["weights"], "the same final weights, bit for bit"
    assert routed["updates"] == bare["updates"] == STEPS
    assert routed["lr_last_epoch"] == bare["lr_last_epoch"] == STEPS
    (scaler,) = summary["scalers"]
    assert (scaler["steps"], scaler["skipped"]) == (STEPS, 0)
    assert scaler["loss_scale_min"] == scaler["loss_scale_max"] == 1.0, "loss scaling is off on a CPU"


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_an_injected_overflow_is_a_skipped_step_in_the_summary(suite_run, style):
    _, _, report, summary = suite_run(style, "emulated")
    assert summary["exit_code"] == 0
    (scaler,) = summary["scalers"]
    assert (scaler["steps"], scaler["skipped"]) == (STEPS, 1)
    assert (scaler["loss_scale_max"], scaler["loss_scale_min"]) == (1024.0, 512.0), "init_loss_scaling, halved once"
    assert report["updates"] == STEPS - 1, "the optimizer left the weights alone at the skipped step"
    assert report["weights_finite"]


@pytest.mark.slow
def test_the_det_style_trainer_turns_amp_off_on_a_cpu_itself(tmp_path):
    """Without use_gpu, PaddleDetection builds GradScaler(enable=False) and auto_cast(enable=False): float32
    throughout, also under --emulate, so the huge input does not overflow and no step is skipped."""
    _, report, summary = _script(tmp_path, "det_style", "off", "--overflow-step", "3",
                                 run_args=["--emulate", "float16"])
    (scaler,) = summary["scalers"]
    assert (scaler["steps"], scaler["skipped"], scaler["loss_scale_min"], scaler["loss_scale_max"]) == (
        STEPS, 0, 1.0, 1.0)
    assert report["scaler_enabled"] is False and report["updates"] == STEPS
    _, bare, _ = _script(tmp_path, "det_style", "bare", "--overflow-step", "3")
    assert report["losses"] == bare["losses"] and report["weights"] == bare["weights"], "float32, as run plainly"


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_a_skipped_step_holds_the_loops_own_lr_scheduler(suite_run, style):
    _, _, report, summary = suite_run(style, "emulated")
    (scaler,) = summary["scalers"]
    assert scaler["skipped"] == 1
    assert report["lr_last_epoch"] == scaler["steps"] - scaler["skipped"] == report["updates"]


# --------------------------------------------------------------------------- records and signals
EVERY_STEP = {"amp/loss", "amp/loss_scale", "amp/log2_loss_scale", "amp/skipped_steps"}


def _points(logdir) -> dict:
    """{tag: [step ids]} of the one run directory under ``logdir``, read by VisualDL's LogReader."""
    from visualdl import LogReader

    (run,) = glob.glob(os.path.join(str(logdir), "*"))
    (path,) = glob.glob(os.path.join(run, "vdlrecords.*"))
    reader = LogReader(file_path=path)
    return {tag: [d.id for d in reader.get_data("scalar", tag)] for tag in reader.get_tags().get("scalar", [])}


def _signalled(tmp_path, signum) -> tuple:
    """The OCR-style loop under `run`, sent ``signum`` once it waits after step 3; (returncode, stdout lines)."""
    command = [sys.executable, *RUN, str(SCRIPTS / "ocr_style.py"), "--out", "out", "--steps", str(STEPS),
               "--wait-after", "3"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
                            start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("waiting"):
                proc.send_signal(signum)
                break
        lines += [line.strip() for line in proc.stdout]
        return proc.wait(timeout=60), lines
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_sigterm_keeps_every_record_of_the_ocr_style_loop(tmp_path):
    pytest.importorskip("visualdl")
    returncode, lines = _signalled(tmp_path, signal.SIGTERM)
    assert returncode == -signal.SIGKILL, "the loop's own handler ran: it kills its process group"
    assert any(line.startswith("main proc ") for line in lines)
    points = _points(tmp_path / "runs")
    assert EVERY_STEP <= set(points), sorted(points)
    assert all(points[tag] == [0, 1, 2] for tag in EVERY_STEP), points


@pytest.mark.slow
def test_sigint_keeps_every_record_of_the_ocr_style_loop(tmp_path):
    pytest.importorskip("visualdl")
    returncode, lines = _signalled(tmp_path, signal.SIGINT)
    assert returncode == -signal.SIGKILL, "the loop's own handler ran: it kills its process group"
    assert any(line.startswith("main proc ") for line in lines)
    points = _points(tmp_path / "runs")
    assert EVERY_STEP <= set(points) and all(points[tag] == [0, 1, 2] for tag in EVERY_STEP), points


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_minimize_records_the_learning_rate_of_every_step(suite_run, style):
    pytest.importorskip("visualdl")
    folder = suite_run(style, "routed")[0]
    assert _points(folder / "runs").get("amp/lr") == list(range(STEPS))
