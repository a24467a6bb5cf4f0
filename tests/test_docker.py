"""The Dockerfiles cannot be built here (no engine): parse them and check what a build relies on."""

from __future__ import annotations

import re
import shlex
import sys
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


#: The Paddle GPU images Paddle's install guide names, with where it names them.
PADDLE_3_GUIDE = ("Paddle 3.0 install guide as given in PaddleX/PaddleOCR's install pages "
                  "(paddlepaddle.github.io/PaddleX/latest/en/installation/paddlepaddle_install.html)")
PADDLE_26_GUIDE = ("Paddle 2.6.1 install guide, docs/install/docker/linux-docker_en.md "
                   "(PaddlePaddle/docs e40073bc246dce0a59fef25bd48b517ca53883b9)")
DOCUMENTED_GPU_TAGS = {
    "ccr-2vdh3abv-pub.cnc.bj.baidubce.com/paddlepaddle/paddle:3.0.0-gpu-cuda11.8-cudnn8.9-trt8.6": PADDLE_3_GUIDE,
    "ccr-2vdh3abv-pub.cnc.bj.baidubce.com/paddlepaddle/paddle:3.0.0-gpu-cuda12.6-cudnn9.5-trt10.5": PADDLE_3_GUIDE,
    **{f"{registry}paddlepaddle/paddle:2.6.1-gpu-{cuda}": PADDLE_26_GUIDE
       for registry in ("", "registry.baidubce.com/")
       for cuda in ("cuda11.2-cudnn8.2-trt8.0", "cuda11.7-cudnn8.4-trt8.4", "cuda12.0-cudnn8.9-trt8.6")},
}


def offered_bases(path: Path) -> list:
    """The BASE_IMAGE values the Dockerfile's comments offer besides its default."""
    return re.findall(r"--build-arg BASE_IMAGE=(\S+)", path.read_text())


def test_the_gpu_image_defaults_to_a_paddle_3_tag_the_guide_names():
    default = resolved_base(ROOT / "docker/Dockerfile.gpu")
    assert default in DOCUMENTED_GPU_TAGS, f"{default} is not a tag Paddle's install guide names"
    assert re.search(r"paddle:3\.\d+\.\d+-gpu-", default), "the default is a Paddle 3.x image"


def test_every_offered_base_is_documented_and_the_26_family_is_one_of_them():
    offered = offered_bases(ROOT / "docker/Dockerfile.gpu")
    assert offered and all(tag in DOCUMENTED_GPU_TAGS for tag in offered), offered
    assert any(":2.6." in tag for tag in offered), "the Paddle 2.6 family is a documented option"


def test_docs_docker_lists_every_documented_tag_with_its_source():
    page = (ROOT / "docs/docker.md").read_text()
    for tag in DOCUMENTED_GPU_TAGS:
        assert f"`{tag}`" in page, tag
    assert "e40073bc246dce0a59fef25bd48b517ca53883b9" in page and "paddlepaddle_install" in page
    assert f"`{resolved_base(ROOT / 'docker/Dockerfile.gpu')}`" in page


def test_the_tag_check_rejects_names_the_guide_does_not_give():
    for wrong in ("paddlepaddle/paddle:2.6.0-gpu-cuda11.8-cudnn8", "paddlepaddle/paddle:latest-gpu",
                  "paddlepaddle/paddle:3.0.0-gpu-cuda12.6-cudnn9.5-trt10.5 "):
        assert wrong not in DOCUMENTED_GPU_TAGS


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
def test_the_rehearsal_kernel_is_built_into_the_system_folder_for_any_uid(path):
    """Built at image build time, as root, with install_system_kernel (the system folder, root's,
    mode 755, which every uid reads: tests/hostile/test_hostile_native_cache.py runs that rule);
    the CPU image installs gcc for that step only; no cache folder is pinned for the user."""
    steps = instructions(path)
    env = dict(rest.split("=", 1) for keyword, rest in steps if keyword == "ENV" and "=" in rest)
    assert "PADDLE_AMP_EXT_CACHE_DIR" not in env and "PADDLE_AMP_EXT_SYSTEM_KERNEL_DIR" not in env
    users = [rest for keyword, rest in steps if keyword == "USER"]
    build = [rest for keyword, rest in steps if keyword == "RUN" and "install_system_kernel()" in rest]
    assert len(build) == 1 and users == ["amp"]
    assert [k for k, _ in steps].index("USER") > [k for k, _ in steps].index("RUN"), "built as root, before USER"
    if path.name.endswith("cpu"):
        words = build[0]
        assert words.index("apt-get install -y --no-install-recommends gcc") < words.index("install_system_kernel") \
            < words.index("apt-get purge -y --auto-remove gcc"), "gcc only for the build"


def test_the_system_folder_is_where_the_package_looks():
    from paddle_amp_ext._native import build

    assert build.system_dirs()[-1] == f"{sys.prefix}/share/paddle_amp_ext"
