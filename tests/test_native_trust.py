"""The native kernel's cache cannot be used to run planted code or to crash the process: a
library is loaded only from a folder and file nobody but the user could have written, and only
once its recorded SHA-256 matches; anything else is built again once, then Paddle's kernels round.

Each planted library here is a real one: the kernel's own source plus a constructor that writes
a marker file when the library is loaded. The marker must never appear."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import kernel_name, no_compiler, require_native_kernel

from paddle_amp_ext._native import build, trust

NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="giving a file to another user needs root")

PLANT = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *marker = fopen(MARKER, "w");
    if (marker) { fputs("planted code ran\n", marker); fclose(marker); }
}
"""


@pytest.fixture(autouse=True)
def kernel_available():
    """Skip where no kernel can be built at all (checked before ``rebuild`` points the cache elsewhere)."""
    require_native_kernel()


def compile_library(tmp_path, name, *sources, marker=None):
    """A shared library from C ``sources`` (texts, or paths), its constructor writing ``marker``."""
    cc = build.compiler()
    if cc is None or build.platform.machine().lower() not in build._X86:
        pytest.skip("no C compiler or no x86 CPU: no library to plant")
    files = []
    for i, source in enumerate(sources):
        if os.path.isfile(source):
            files.append(source)
        else:
            path = tmp_path / f"{name}-{i}.c"
            path.write_text(source)
            files.append(str(path))
    out = tmp_path / f"{name}.so"
    define = [f'-DMARKER="{marker}"'] if marker else []
    subprocess.run([*cc, "-O2", "-shared", "-fPIC", *define, "-o", str(out), *files], check=True, timeout=120)
    return out


def plant(tmp_path, folder, with_record=True):
    """A working kernel that also writes ``tmp_path/marker`` when loaded, under the cached name in
    ``folder``, with a record matching it (as a planter who read this package would write)."""
    marker = tmp_path / "marker"
    library = compile_library(tmp_path, "planted", build.SOURCE, PLANT, marker=marker)
    folder.mkdir(exist_ok=True)
    target = folder / kernel_name()
    shutil.copyfile(library, tmp_path / "copy.so")
    os.replace(tmp_path / "copy.so", target)  # a new file: never write into a library this process mapped
    if with_record:
        record = {**build.build_description(), "compiler": build.compiler_identity(build.compiler()),
                  "library_sha256": hashlib.sha256(library.read_bytes()).hexdigest()}
        (folder / (target.stem + ".json")).write_text(json.dumps(record))
    return target, marker


@pytest.mark.parametrize("mode,who", [(0o777, "everyone"), (0o770, "its group"), (0o1777, "everyone")])
def test_a_library_planted_in_a_shared_folder_never_runs(rebuild, tmp_path, caplog_amp, mode, who):
    target, marker = plant(tmp_path, rebuild)
    rebuild.chmod(mode)
    current = build.status()
    assert not marker.exists(), "the planted library was loaded"
    assert current.available, current
    assert current.detail == (f"built in a temporary folder ({rebuild} is writable by {who} (mode {mode:o}): "
                              "a library there could have been planted, so nothing in it is loaded)")
    build.reset()
    assert build.status() == current and not marker.exists()
    warnings = [r for r in caplog_amp.records if "kernel cache" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING", "said once"
    assert "Set PADDLE_AMP_EXT_CACHE_DIR to a folder only you can write" in warnings[0].getMessage()
    assert sorted(os.listdir(rebuild)) == sorted([target.name, target.stem + ".json"]), "nothing touched there"


def test_a_shared_folder_without_a_compiler_loads_nothing(rebuild, tmp_path, monkeypatch):
    _, marker = plant(tmp_path, rebuild)
    rebuild.chmod(0o777)
    no_compiler(monkeypatch, tmp_path)
    current = build.status()
    assert not marker.exists() and not current.available
    assert current.detail == (f"{rebuild} is writable by everyone (mode 777): a library there could have been "
                              "planted, so nothing in it is loaded, and no C compiler found (set CC, or install gcc)")


@as_root
def test_a_folder_owned_by_another_user_is_not_looked_into(rebuild, tmp_path):
    target, marker = plant(tmp_path, rebuild)
    for path in (rebuild, target, target.with_suffix(".json")):
        os.chown(path, NOBODY, NOBODY)
    rebuild.chmod(0o755)
    current = build.status()
    assert not marker.exists() and current.available
    assert current.detail.startswith(f"built in a temporary folder ({rebuild} is owned by uid {NOBODY}, "
                                     f"not by this user (uid 0): ")


def test_a_folder_inside_one_others_can_write_is_refused_unless_sticky(rebuild, tmp_path, monkeypatch):
    open_parent, sticky_parent = tmp_path / "open", tmp_path / "sticky"
    for parent, mode in ((open_parent, 0o777), (sticky_parent, 0o1777)):
        parent.mkdir()
        parent.chmod(mode)
    _, marker = plant(tmp_path, open_parent / "cache")
    monkeypatch.setenv(build.ENV_CACHE, str(open_parent / "cache"))
    build.reset()
    refused = build.status()
    assert not marker.exists() and refused.available
    assert refused.detail.startswith(f"built in a temporary folder ({open_parent} (above the cache folder) is "
                                     "writable by everyone (mode 777): ")
    monkeypatch.setenv(build.ENV_CACHE, str(sticky_parent / "cache"))  # as in /tmp
    build.reset()
    assert build.status().detail == str(sticky_parent / "cache" / kernel_name())


@pytest.mark.parametrize("how", ["no record", "another library's record", "a symbolic link"])
def test_a_library_planted_in_the_users_own_folder_is_built_again_unloaded(rebuild, tmp_path, how):
    real = build.status().detail
    build.reset()
    record = rebuild / (kernel_name()[:-3] + ".json")
    genuine = record.read_text()
    target, marker = plant(tmp_path, rebuild, with_record=how != "no record")
    if how == "no record":
        record.unlink()
    if how == "another library's record":
        record.write_text(genuine)
    if how == "a symbolic link":
        os.replace(target, tmp_path / "elsewhere.so")
        target.symlink_to(tmp_path / "elsewhere.so")
    current = build.status()
    assert not marker.exists(), "the planted library was loaded"
    assert current.available and current.detail.startswith(f"{real} (built again: {real} was not loaded: ")
    reason = current.detail.split(" was not loaded: ", 1)[1]
    if how == "no record":
        assert reason == f"it has no record of its build ({record.name}))"
    elif how == "another library's record":
        assert reason.startswith("its SHA-256 is ") and "recorded when it was built" in reason
    else:
        assert "Too many levels of symbolic links" in reason
    assert not target.is_symlink()


@as_root
@pytest.mark.parametrize("change", ["owned by nobody", "group-writable"])
def test_a_library_file_others_could_write_is_not_loaded(rebuild, tmp_path, change):
    target, marker = plant(tmp_path, rebuild)
    if change == "owned by nobody":
        os.chown(target, NOBODY, NOBODY)
        expected = f"{target} is owned by uid {NOBODY}, not by this user (uid 0)"
    else:
        target.chmod(0o664)
        expected = f"{target} is writable by its group (mode 664)"
    current = build.status()
    assert not marker.exists() and current.available
    assert current.detail == f"{target} (built again: {target} was not loaded: {expected})"


def test_a_truncated_library_is_built_again_instead_of_crashing(rebuild):
    """Loading a cut-short library maps pages past its end (SIGBUS); its digest stops it first.
    Run in a child process: a crash there fails this test instead of killing the suite."""
    path = build.status().detail
    whole = open(path, "rb").read()
    cut = path + ".cut"
    with open(cut, "wb") as handle:  # a new file renamed over it: this process's mapping stays whole
        handle.write(whole[: len(whole) // 2])
    os.chmod(cut, 0o755)
    os.replace(cut, path)
    code = "from paddle_amp_ext._native import status; print(status().detail)"
    env = {**os.environ, build.ENV_CACHE: str(rebuild)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip().startswith(f"{path} (built again: {path} was not loaded: its SHA-256 is ")
    assert proc.stdout.strip().endswith(f"recorded when it was built ({len(whole) // 2} bytes: cut short or "
                                        "changed since))")
    assert open(path, "rb").read() == whole


def own_record(library):
    trust.write_record(str(library), {**build.build_description(),
                                      "compiler": build.compiler_identity(build.compiler())},
                       trust.record_path(str(library)))


def test_a_recorded_library_missing_a_function_is_built_again(rebuild, tmp_path):
    """The user's own library (a record matches) from an older source without the kernel's
    rounding function: its constructor runs, then it is replaced."""
    old = compile_library(tmp_path, "old", "int pae_fp16_supported(void) { return 1; }\n")
    rebuild.mkdir()
    target = rebuild / kernel_name()
    os.replace(old, target)
    own_record(target)
    current = build.status()
    assert current.available
    assert current.detail.startswith(f"{target} (built again: {target} was not loaded: ")
    assert current.detail.endswith("undefined symbol: pae_round_fp16)")


@pytest.mark.parametrize("content,expected", [
    (b"not a library" * 100, "invalid ELF header"),
    (None, "it was built by 'cc-of-another-machine 1.0', not by the compiler here"),
])
def test_a_recorded_file_that_does_not_load_or_was_built_otherwise_is_built_again(rebuild, content, expected):
    path = build.status().detail
    build.reset()
    record = trust.record_path(path)
    if content is not None:
        replacement = path + ".new"
        with open(replacement, "wb") as handle:
            handle.write(content)
        os.replace(replacement, path)
        own_record(path)
    else:
        saved = json.load(open(record))
        saved["compiler"] = "cc-of-another-machine 1.0"
        with open(record, "w") as handle:
            json.dump(saved, handle)
    current = build.status()
    assert current.available and current.detail.startswith(f"{path} (built again: {path} was not loaded: ")
    assert expected in current.detail


def test_when_building_again_fails_paddle_kernels_round_and_check_says_why(rebuild, monkeypatch):
    rebuild.mkdir()
    path = rebuild / build.library_name(build.compiler_identity(["false"]))
    path.write_bytes(b"\x7fELF cut short")
    env = {**os.environ, build.ENV_CACHE: str(rebuild), "CC": "false"}
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", "--json", "--build-kernel"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reason = (f"{path} was not loaded: it has no record of its build ({path.stem}.json); "
              "building it again failed: false failed (exit 1): ")
    assert json.loads(proc.stdout)["rehearsal_rounding"] == {
        "native": False, "detail": f"{reason}; in a temporary folder: false failed (exit 1): "}
    assert sorted(os.listdir(rebuild)) == [path.name], "nothing half-written left"
