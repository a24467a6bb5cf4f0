"""The Dockerfiles cannot be built here (no engine): parse them and check what a build relies on."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))


def instructions(path: Path) -> list:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def resolved_base(path: Path) -> str:
    args = {}
    for keyword, rest in instructions(path):
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = value
        if keyword == "FROM":
            return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
    raise AssertionError(f"{path.name} has no FROM")


def test_there_is_a_gpu_and_a_cpu_image():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_is_pinned(path):
    image = resolved_base(path)
    name, _, tag = image.partition(":")
    assert tag and tag != "latest" and "latest" not in tag and re.search(r"\d+\.\d+", tag), image


def test_gpu_image_is_the_official_paddle_image_and_names_a_3x_alternative():
    assert resolved_base(ROOT / "docker/Dockerfile.gpu") == "paddlepaddle/paddle:2.6.0-gpu-cuda11.8-cudnn8"
    alternative = re.search(r"BASE_IMAGE=(paddlepaddle/paddle:3\.\d+\.\d+-gpu\S+)", (ROOT / "docker/Dockerfile.gpu").read_text())
    assert alternative, "a Paddle 3.x GPU base is offered"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_installs_the_package_with_visualdl_and_has_a_default_command(path):
    steps = instructions(path)
    copies = [rest for keyword, rest in steps if keyword == "COPY"]
    assert any(rest.startswith("paddle_amp_ext") for rest in copies)
    pip = [rest for keyword, rest in steps if keyword == "RUN" and "pip install" in rest]
    assert pip and any('".[visualdl' in rest for rest in pip)
    if path.name.endswith("gpu"):
        assert "paddlepaddle" not in " ".join(pip), "the GPU image already has Paddle"
    else:
        assert re.search(r"paddlepaddle==\d+\.\d+\.\d+", " ".join(pip))
    cmd = [rest for keyword, rest in steps if keyword == "CMD"]
    assert len(cmd) == 1
    argv = shlex.split(cmd[0].strip("[]").replace('", "', '" "'))
    assert argv[:3] == ["python", "-m", "paddle_amp_ext.check"]


def test_copied_paths_exist_and_build_context_skips_venvs():
    for path in DOCKERFILES:
        for keyword, rest in instructions(path):
            if keyword == "COPY":
                for item in rest.split()[:-1]:
                    assert (ROOT / item).exists(), f"{path.name}: COPY {item} does not exist"
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv*" in ignore and "runs" in ignore


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_rehearsal_kernel_is_built_into_the_image(path):
    """Built at image build time into a cache folder the running container reads (the CPU image
    installs gcc for that step only); the folder belongs to the image's user."""
    steps = instructions(path)
    env = dict(rest.split("=", 1) for keyword, rest in steps if keyword == "ENV" and "=" in rest)
    folder = env.get("PADDLE_AMP_EXT_CACHE_DIR", "")
    assert folder.startswith("/opt/paddle-amp-ext/")
    build = [rest for keyword, rest in steps if keyword == "RUN" and "paddle_amp_ext._native import status" in rest]
    assert len(build) == 1
    assert "chown -R amp" in build[0] and "/opt/paddle-amp-ext" in build[0]
    if path.name.endswith("cpu"):
        words = build[0]
        assert words.index("apt-get install -y --no-install-recommends gcc") < words.index("_native import status") \
            < words.index("apt-get purge -y --auto-remove gcc"), "gcc only for the build"
