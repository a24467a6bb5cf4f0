"""The kernel cache shared by several Pythons, compilers, threads, processes and uids.

Keyed by compiler (resolved path and ``--version``) and Python ABI, two installs sharing one HOME
keep a library each instead of building over each other's at every start; concurrent builders
never leave a partial file; a system folder built by root (docker/Dockerfile.cpu) is loaded by
any uid, and only where nobody but root or that uid could have written it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from helpers import kernel_name, require_native_kernel

from paddle_amp_ext._native import build, cache, trust

ROOT = Path(__file__).resolve().parent.parent.parent
NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="root-owned files need root")
STATUS = "from paddle_amp_ext._native import status; print(status().detail)"


@pytest.fixture(autouse=True)
def kernel_available():
    require_native_kernel()
    if build.compiler() is None:
        pytest.skip("no C compiler")


def wrapper_compiler(folder: Path, name: str) -> str:
    """Another compiler, as a second Python install would bring: the same gcc behind another path."""
    path = folder / name
    path.write_text(f'#!/bin/sh\nexec {" ".join(build.compiler())} "$@"\n')
    path.chmod(0o755)
    return str(path)


def status_in(cache: Path, **env) -> str:
    full = {**os.environ, build.ENV_CACHE: str(cache), build.ENV_SYSTEM: str(cache.parent / "no-system"),
            "PYTHONPATH": str(ROOT), **env}
    full.pop(build.ENV_SWITCH, None)
    proc = subprocess.run([sys.executable, "-c", STATUS], capture_output=True, text=True, timeout=300, env=full)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_two_compilers_sharing_one_cache_keep_a_library_each(tmp_path):
    cache = tmp_path / "cache"
    one, two = wrapper_compiler(tmp_path, "cc-one"), wrapper_compiler(tmp_path, "cc-two")
    first, second = status_in(cache, CC=one), status_in(cache, CC=two)
    assert first != second and first.startswith(str(cache / build.library_prefix()))
    assert second.startswith(str(cache / build.library_prefix())) and "built again" not in first + second
    built = {p: os.stat(p).st_mtime_ns for p in (first, second)}
    assert status_in(cache, CC=one) == first and status_in(cache, CC=two) == second, "each loads its own"
    assert {p: os.stat(p).st_mtime_ns for p in built} == built, "nothing built again or overwritten"
    records = [json.loads(Path(p[:-3] + ".json").read_text())["compiler"] for p in (first, second)]
    assert records[0].startswith(one) and records[1].startswith(two)
    assert sorted(os.listdir(cache)) == sorted([Path(first).name, Path(first).stem + ".json",
                                                Path(second).name, Path(second).stem + ".json"])


def test_another_python_abi_gets_its_own_file(rebuild, monkeypatch):
    mine = build.status().detail
    build.reset()
    description = build.build_description()
    monkeypatch.setattr(cache, "build_description", lambda: {**description, "python": "cpython-313t"})
    other = build.status().detail
    assert other != mine and os.path.exists(mine) and os.path.exists(other)
    assert json.loads(Path(other[:-3] + ".json").read_text())["python"] == "cpython-313t"


def test_threads_building_into_one_empty_folder_all_get_the_kernel(tmp_path):
    folder, cc = tmp_path / "cache", build.compiler()
    results, errors = [], []

    def one():
        try:
            results.append(build._build_in(cc, str(folder))[1])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == [] and len(results) == 4
    assert {r.split(" (built again")[0] for r in results} == {str(folder / kernel_name())}
    assert sorted(os.listdir(folder)) == sorted([kernel_name(), kernel_name()[:-3] + ".json"]), "no partial file"


def test_processes_building_into_one_empty_folder_all_get_the_kernel(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, build.ENV_CACHE: str(cache), build.ENV_SYSTEM: str(tmp_path / "none"),
           "PYTHONPATH": str(ROOT)}
    env.pop(build.ENV_SWITCH, None)
    procs = [subprocess.Popen([sys.executable, "-c", STATUS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-500:] for o in outs]
    assert {o[0].strip().split(" (built again")[0] for o in outs} == {str(cache / kernel_name())}
    assert sorted(os.listdir(cache)) == sorted([kernel_name(), kernel_name()[:-3] + ".json"])


@pytest.fixture
def system_folder():
    """A folder every uid can reach (not under pytest's private tmp), removed after."""
    top = Path(tempfile.mkdtemp(prefix="pae-system-", dir="/tmp"))
    top.chmod(0o755)
    yield top / "kernels"
    shutil.rmtree(top, ignore_errors=True)


def as_uid(uid: int, env: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """``STATUS`` in a process that sees itself as ``uid`` (``os.geteuid``, as under ``docker run
    --user uid``; a real setuid needs an interpreter every uid can run), no compiler on PATH."""
    site = tmp_path / f"as-{uid}"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(f"import os\nos.geteuid = lambda: {uid}\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", STATUS], capture_output=True, text=True, timeout=300, env=env)


def other_uid_env(system: Path) -> dict:
    return {"PATH": "/nonexistent", "HOME": "/nonexistent", build.ENV_SYSTEM: str(system), "CC": "",
            build.ENV_CACHE: "/nonexistent-pae-cache/cache"}


@as_root
def test_a_kernel_root_built_into_a_system_folder_loads_for_any_uid(system_folder, tmp_path):
    installed = build.install_system_kernel(str(system_folder))
    assert installed.available, installed
    mode = stat.S_IMODE(os.stat(system_folder).st_mode)
    assert mode == 0o755 and os.stat(installed.detail).st_uid == 0
    proc = as_uid(NOBODY, other_uid_env(system_folder), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == installed.detail, "loaded from the system folder, nothing built"
    assert not os.path.exists("/nonexistent-pae-cache")
    assert sorted(os.listdir(system_folder)) == sorted([Path(installed.detail).name,
                                                        Path(installed.detail).stem + ".json"])


@as_root
@pytest.mark.parametrize("change", ["folder group-writable", "file owned by another uid", "record world-writable",
                                    "library a symbolic link"])
def test_a_system_folder_others_could_write_is_not_loaded(system_folder, change, tmp_path):
    installed = build.install_system_kernel(str(system_folder))
    library = Path(installed.detail)
    if change == "folder group-writable":
        system_folder.chmod(0o775)
    elif change == "file owned by another uid":
        os.chown(library, 4242, 4242)
    elif change == "record world-writable":
        library.with_suffix(".json").chmod(0o666)
    else:
        moved = system_folder / "elsewhere.bin"
        os.replace(library, moved)
        library.symlink_to(moved)
    proc = as_uid(NOBODY, other_uid_env(system_folder), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "no C compiler found (set CC, or install gcc)", "refused, and nothing else to do"
    mine = as_uid(0, other_uid_env(system_folder), tmp_path)  # root's own view: the same refusals for root
    assert mine.stdout.strip() == proc.stdout.strip()


def test_the_system_rule_without_root(monkeypatch, tmp_path):
    """The same rule simulated in-process where the tests do not run as root: this user plays root,
    another uid runs; a folder and files of "root" load, a group-writable folder does not."""
    folder = tmp_path / "system"
    installed = build.install_system_kernel(str(folder))
    assert installed.available
    real = os.geteuid()
    monkeypatch.setattr(trust, "ROOT_UID", real)
    monkeypatch.setattr(trust.os, "geteuid", lambda: real + 1000)
    trust.check_folder(str(folder), allow_root=True)
    trust.verify(installed.detail, build.build_description(), None, allow_root=True)
    with pytest.raises(trust.UntrustedError, match=f"is owned by uid {real}, not by this user"):
        trust.check_folder(str(folder))  # the user's own cache rule: root's folder is not the user's
    folder.chmod(0o775)
    with pytest.raises(trust.UntrustedError, match=r"is writable by its group \(mode 775\)"):
        trust.check_folder(str(folder), allow_root=True)
    folder.chmod(0o1777)
    with pytest.raises(trust.UntrustedError, match=r"is writable by everyone \(mode 1777\)"):
        trust.check_folder(str(folder), allow_root=True)  # sticky does not help the folder itself


def test_install_system_kernel_without_a_compiler_says_so(tmp_path, monkeypatch):
    from helpers import no_compiler

    no_compiler(monkeypatch, tmp_path)
    assert build.install_system_kernel(str(tmp_path / "k")) == build.NativeStatus(False, build.NO_COMPILER)
    assert not (tmp_path / "k").exists()


def test_cached_status_never_loads_from_a_folder_others_can_write_and_writes_nothing(tmp_path, monkeypatch):
    """``check``'s read-only look: a library planted in a world-writable cache is not loaded (its
    constructor would write the marker), and nothing is built in its place."""
    from test_native_trust import plant

    cache = tmp_path / "cache"
    _, marker = plant(tmp_path, cache)
    cache.chmod(0o777)
    monkeypatch.setenv(build.ENV_CACHE, str(cache))
    monkeypatch.setenv(build.ENV_SYSTEM, str(tmp_path / "none"))
    build.reset()
    before = sorted(os.listdir(cache))
    current = build.cached_status()
    assert not marker.exists() and not current.available
    assert current.detail == f"{build.NOT_BUILT}; {cache} is writable by everyone (mode 777)"
    assert sorted(os.listdir(cache)) == before


@pytest.mark.parametrize("what", ["a file", "a dangling link", "a fifo", "missing"])
def test_cached_status_with_odd_cache_and_system_paths_says_not_built(tmp_path, monkeypatch, what):
    odd = tmp_path / "odd"
    if what == "a file":
        odd.write_text("not a folder")
    elif what == "a dangling link":
        odd.symlink_to(tmp_path / "nowhere")
    elif what == "a fifo":
        os.mkfifo(odd)
    monkeypatch.setenv(build.ENV_CACHE, str(odd))
    monkeypatch.setenv(build.ENV_SYSTEM, os.pathsep.join([str(odd), "", str(tmp_path / "none")]))
    build.reset()
    current = build.cached_status()
    assert not current.available and current.detail.startswith(build.NOT_BUILT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if what == "missing" else ["odd"])


def test_cached_status_says_what_status_loads_past_a_damaged_newer_library(rebuild, tmp_path, monkeypatch):
    """Without a compiler any library of this build is a candidate, newest first: a damaged newer
    one is passed over by ``check``'s read-only look as by the load itself (one lookup for both)."""
    from helpers import no_compiler

    monkeypatch.setenv(build.ENV_SYSTEM, str(tmp_path / "none"))
    good = Path(build.status().detail)
    assert build.status().available and good.parent == rebuild
    damaged = rebuild / build.library_name("another compiler: 1.0")
    damaged.write_bytes(b"\x7fELF cut short")
    os.utime(damaged, (good.stat().st_mtime + 60,) * 2)  # the newest: looked at first
    no_compiler(monkeypatch, tmp_path)
    build.reset()
    looked = build.cached_status()
    build.reset()
    loaded = build.status()
    assert looked == loaded == build.NativeStatus(True, str(good))
    damaged.unlink()
    (rebuild / (good.stem + ".json")).unlink()  # the only library left has no record of its build
    build.reset()
    assert build.cached_status() == build.NativeStatus(
        False, f"{build.NOT_BUILT}, but {build.NO_COMPILER}; {good} was not loaded: it has no record of its build "
               f"({good.stem}.json)")
