"""A real client: PaddleOCR's ``tools/train.py`` under ``python -m paddle_amp_ext.run --emulate float16``.

Needs a PaddleOCR checkout and a venv with its requirements, paddlepaddle 3.x and this package; not
built by scripts/test, so the test skips unless both are given:
    PADDLE_AMP_EXT_PADDLEOCR_DIR=/path/to/PaddleOCR  (checked with phat-ktran/PaddleOCR e6614364)
    PADDLE_AMP_EXT_PADDLEOCR_PYTHON=/path/to/venv/bin/python
A tiny CRNN (``paddleocr_tiny_rec.yml``) on 48 synthetic word images, 24 iterations, fp16 O2 with
dynamic loss scaling from 2**20: the first steps are skipped (float16 overflow), later ones applied.
The VisualDL records ``run`` writes have every tag on every iteration: ``amp/lr`` too, on the skipped
steps before the first applied one (before, 21 of 24: none until the first applied step).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
ITERATIONS = 24  # 48 images, batch 8, drop_last, 4 epochs
MAKE_DATA = """
import random, sys
from pathlib import Path
from PIL import Image, ImageDraw
random.seed(0)
root = Path(sys.argv[1]); (root / "img").mkdir(parents=True)
lines = []
for i in range(48):
    word = "".join(random.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(random.randint(3, 8)))
    img = Image.new("RGB", (100, 32), (255, 255, 255))
    ImageDraw.Draw(img).text((4, 10), word, fill=(0, 0, 0))
    img.save(root / "img" / f"w{i}.png")
    lines.append(f"img/w{i}.png\\t{word}")
(root / "train.txt").write_text("\\n".join(lines) + "\\n")
"""


def _client() -> tuple:
    checkout, python = os.environ.get("PADDLE_AMP_EXT_PADDLEOCR_DIR"), os.environ.get("PADDLE_AMP_EXT_PADDLEOCR_PYTHON")
    if not checkout or not python:
        pytest.skip("PADDLE_AMP_EXT_PADDLEOCR_DIR and PADDLE_AMP_EXT_PADDLEOCR_PYTHON are not set (a PaddleOCR "
                    "checkout and a venv with its requirements; not built by scripts/test)")
    if not (Path(checkout) / "tools" / "train.py").is_file():
        pytest.skip(f"PADDLE_AMP_EXT_PADDLEOCR_DIR={checkout!r} has no tools/train.py")
    return Path(checkout), python


@pytest.fixture(scope="module")
def ocr_run(tmp_path_factory):
    checkout, python = _client()
    tmp = tmp_path_factory.mktemp("paddleocr")
    subprocess.run([python, "-c", MAKE_DATA, str(tmp / "data")], check=True, timeout=120)
    config = tmp / "tiny_rec.yml"
    config.write_text((HERE / "paddleocr_tiny_rec.yml").read_text().replace("DATA", str(tmp / "data")))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([python, "-m", "paddle_amp_ext.run", "--json", "--emulate", "float16", "--logdir",
                           str(tmp / "vdl"), "tools/train.py", "-c", str(config), "-o",
                           f"Global.save_model_dir={tmp / 'model'}"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, tmp / "vdl"


def _scalars(vdl: Path) -> dict:
    from visualdl import LogReader

    (records,) = vdl.glob("*/vdlrecords.*")
    reader = LogReader(file_path=str(records))
    return {tag: [(d.id, d.value) for d in reader.get_data("scalar", tag)] for tag in reader.get_tags()["scalar"]}


@pytest.mark.slow
def test_paddleocr_trains_under_the_rehearsal_and_skips_its_first_overflowing_steps(ocr_run):
    proc, vdl = ocr_run
    scalars = _scalars(vdl)
    scales = [value for _, value in scalars["amp/loss_scale"]]
    assert len(scales) == ITERATIONS and scales[0] == 2.0**20
    assert scales[1] == 2.0**19, "the first step overflowed float16 and was skipped"
    assert [value for _, value in scalars["amp/skipped_steps"]][-1] >= 1


@pytest.mark.slow
def test_every_tag_is_recorded_on_every_iteration_amp_lr_on_skipped_steps_too(ocr_run):
    scalars = _scalars(ocr_run[1])
    for tag in ("amp/loss", "amp/loss_scale", "amp/lr", "amp/skipped_steps"):
        assert [step for step, _ in scalars[tag]] == list(range(ITERATIONS)), tag
    assert {value for _, value in scalars["amp/lr"]} == {float(np.float32(0.0005))}  # constant rate, stored as float32
