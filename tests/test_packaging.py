"""The sdist and wheel as a registry and a user get them: built with ``python -m build`` from a copy
of the repository, checked with ``twine check``, the sdist's own tests collected from the archive."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
NOT_SHIPPED = (".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "site", "runs", "log",
               ".pytest_cache", ".ruff_cache")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def tracked_files(folder: str) -> set:
    """The repository's files under ``folder`` (what a clean clone holds), relative to the root."""
    proc = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    return {line for line in proc.stdout.splitlines() if (ROOT / line).is_file()}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """(sdist path, wheel path): ``python -m build`` run on a copy, so the checkout gets no egg-info."""
    if importlib.util.find_spec("build") is None:
        pytest.fail("the 'build' package is missing: pip install -e '.[test]'")
    work = tmp_path_factory.mktemp("dist")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(work / "out"), str(source)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sdists, wheels = sorted((work / "out").glob("*.tar.gz")), sorted((work / "out").glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list((work / "out").iterdir())
    return sdists[0], wheels[0]


def sdist_names(sdist: Path) -> set:
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    prefix = names[0].split("/")[0] + "/"
    return {name[len(prefix):] for name in names if name.startswith(prefix)}


def test_the_sdist_holds_every_test_support_file_doc_and_example(dist):
    names = sdist_names(dist[0])
    for folder in ("tests", "docs", "examples", "benchmarks", "paddle_amp_ext", "docker", "scripts"):
        missing = tracked_files(folder) - names
        assert not missing, f"{folder}: {sorted(missing)[:10]}"
    for name in ("README.md", "CHANGELOG.md", "LICENSE", "mkdocs.yml", ".dockerignore", "pyproject.toml",
                 "setup.py", "MANIFEST.in", "tests/conftest.py", "tests/helpers.py", "PKG-INFO"):
        assert name in names, name
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]


def test_the_wheel_holds_the_package_and_its_kernel_source_only(dist):
    with zipfile.ZipFile(dist[1]) as archive:
        names = archive.namelist()
    assert "paddle_amp_ext/_native/fp16round.c" in names and "paddle_amp_ext/py.typed" in names
    assert {n.split("/")[0] for n in names} == {"paddle_amp_ext", "paddle_amp_ext-0.1.0.dist-info"}


def test_twine_check_passes_and_the_registry_page_has_urls_classifiers_and_absolute_links(dist):
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("PASSED") == 2, proc.stdout + proc.stderr
    with tarfile.open(dist[0]) as archive:
        member = next(m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        metadata = Parser().parsestr(archive.extractfile(member).read().decode("utf-8"))
    urls = dict(value.split(", ", 1) for value in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = metadata.get_all("Classifier")
    for version in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert any(c.startswith("Operating System :: ") for c in classifiers)
    assert metadata["Requires-Python"] == ">=3.9"
    assert metadata["Description-Content-Type"] == "text/markdown"
    body = metadata.get_payload()
    targets = _LINK.findall(body)
    readme_targets = _LINK.findall((ROOT / "README.md").read_text())
    assert len(targets) == len(readme_targets) > 30, "every README link is on the page"
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#"))]
    assert relative == []
    source = urls["Source"]
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", body)
    assert images and all(image.startswith(f"{source}/raw/main/") for image in images)
    assert f"]({source}/blob/main/docs/install.md)" in body


def test_the_sdists_own_tests_collect_from_the_extracted_archive(dist, tmp_path):
    with tarfile.open(dist[0]) as archive:
        archive.extractall(tmp_path, filter="data") if sys.version_info >= (3, 12) else archive.extractall(tmp_path)
    (unpacked,) = tmp_path.iterdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(unpacked), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests"], cwd=unpacked, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = re.search(r"(\d+) tests? collected", proc.stdout)
    assert collected and int(collected.group(1)) > 500, proc.stdout[-500:]
    assert "error" not in proc.stdout.lower().split("collected")[-1], proc.stdout[-2000:]


def load_setup():
    spec = importlib.util.spec_from_file_location("paddle_amp_ext_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() itself runs only as __main__
    return module


def test_registry_readme_makes_relative_links_absolute_and_leaves_the_rest():
    rewrite = load_setup().registry_readme
    text = ("[a](docs/x.md) [b](docs/x.md#part) ![c](docs/p.png) [d](https://e.org/f) [g](#top) "
            "[h](./CHANGELOG.md) [i](mailto:x@y.z) [j](/abs) `[k](not a link)` []()")
    assert rewrite(text, "https://github.com/o/r/") == (
        "[a](https://github.com/o/r/blob/main/docs/x.md) [b](https://github.com/o/r/blob/main/docs/x.md#part) "
        "![c](https://github.com/o/r/raw/main/docs/p.png) [d](https://e.org/f) [g](#top) "
        "[h](https://github.com/o/r/blob/main/CHANGELOG.md) [i](mailto:x@y.z) [j](/abs) `[k](not a link)` []()")
    assert rewrite("", "https://x") == ""


def test_the_paddle_extras_never_pair_paddle_26_with_numpy_2():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    paddle_extras = {name: [Requirement(r) for r in reqs] for name, reqs in extras.items()
                     if any(Requirement(r).name.startswith("paddlepaddle") for r in reqs)}
    assert set(paddle_extras) == {"cpu", "gpu", "cpu-paddle26", "gpu-paddle26"}
    for name, reqs in paddle_extras.items():
        paddle = next(r for r in reqs if r.name.startswith("paddlepaddle"))
        numpy = [r for r in reqs if r.name == "numpy"]
        allows_26 = any(v in paddle.specifier for v in ("2.6.0", "2.6.2"))
        assert allows_26 == name.endswith("paddle26"), name
        if allows_26:
            assert numpy and "2.0.0" not in numpy[0].specifier and "1.26.4" in numpy[0].specifier, name
            assert "2.7.0" not in paddle.specifier and "3.0.0" not in paddle.specifier
    assert paddle_extras["gpu"][0].specifier == SpecifierSet(">=3.0")
