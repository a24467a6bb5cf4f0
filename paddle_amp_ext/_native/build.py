"""Build, cache and load the one-pass float16 and bfloat16 rounding kernels (``fp16round.c``).

The fp16 rehearsal rounds every weight, activation and gradient that AMP would hold in float16,
on a CPU. Paddle's kernels can do that exactly in thirteen float32 passes
(:func:`paddle_amp_ext._compat.kernels.round_to_float16`); the x86 F16C instructions do it in
one (about 7x faster at 512x512). Paddle exposes no such kernel on a CPU (its cast converts in
software), so the C file is compiled on first use with the machine's C compiler, cached, and
loaded with :mod:`ctypes`. Nothing here runs at import time.

Where it cannot be had, the rehearsal keeps Paddle's kernels, with the same results:

- ``PADDLE_AMP_EXT_NATIVE=0`` (or ``false``/``off``/``no``) turns it off;
- a CPU other than x86 with F16C (e.g. aarch64), or no C compiler (``CC``, then Python's
  compiler, then ``cc``) and no library built before (a cache folder may hold one built on
  another machine of the same kind: ``docker/Dockerfile.cpu`` builds it, then drops gcc);
- no writable cache folder and no temporary folder (the kernel is built in
  ``$PADDLE_AMP_EXT_CACHE_DIR``, else ``$XDG_CACHE_HOME/paddle_amp_ext`` or
  ``~/.cache/paddle_amp_ext``; failing that in a private temporary folder removed after
  loading);
- a library that does not round a probe exactly as numpy does (float16) or as the bfloat16
  values written out in :func:`_bf16_probe` say.

The bfloat16 kernel (integer round-to-nearest-even on the bit pattern, AVX2 where the CPU has it)
is built and loaded with the float16 one, from the same file, under the same conditions.

:func:`status` says which, and why; ``python -m paddle_amp_ext.check`` shows it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional, Tuple

logger = logging.getLogger(__name__)

ENV_SWITCH = "PADDLE_AMP_EXT_NATIVE"
ENV_CACHE = "PADDLE_AMP_EXT_CACHE_DIR"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp16round.c")
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")

#: ``rounder(src_ptr, dst_ptr, n)``: rounds ``n`` float32 values (``dst`` may be ``src``).
Rounder = Callable[[int, int, int], int]


class Kernels(NamedTuple):
    """The loaded library's rounders, by the type they round to."""

    fp16: Rounder
    bf16: Rounder


@dataclass(frozen=True)
class NativeStatus:
    """Whether the one-pass kernel is in use, and where it came from or why not."""

    available: bool
    detail: str

    def __str__(self) -> str:
        return ("native F16C kernel: " if self.available else "Paddle kernels (13 passes): ") + self.detail


class BuildError(RuntimeError):
    """The kernel could not be built or loaded; the message says why."""


def compiler() -> Optional[List[str]]:
    """The C compiler command: ``$CC``, else Python's own compiler, else ``cc``; None if absent."""
    for text in (os.environ.get("CC", ""), sysconfig.get_config_var("CC") or "", "cc"):
        words = shlex.split(text)
        if words and shutil.which(words[0]):
            return words
    return None


def cache_dir() -> str:
    """Where built kernels are kept (see the module docstring)."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return explicit
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "paddle_amp_ext")


_FLAGS = ("-O2", "-shared", "-fPIC")
NO_COMPILER = "no C compiler found (set CC, or install gcc)"


def library_name() -> str:
    """The cached file's name: changes with the source, the flags and the machine, not with the
    compiler (a library built where there is one loads where there is none)."""
    with open(SOURCE, "rb") as handle:
        digest = hashlib.sha256(handle.read())
    digest.update(f"{' '.join(_FLAGS)} {sys.platform} {platform.machine()}".encode())
    return f"fp16round-{digest.hexdigest()[:16]}.so"


def _compile(cc: List[str], target: str) -> None:
    """Compile to ``target`` through a temporary name in its folder, then rename: concurrent
    builds (one per rank of a launch) never load a half-written file."""
    handle, partial = tempfile.mkstemp(prefix=".fp16round-", suffix=".so", dir=os.path.dirname(target))
    os.close(handle)
    try:
        proc = subprocess.run([*cc, *_FLAGS, "-o", partial, SOURCE], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cc)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _build_in(cc: Optional[List[str]], folder: str) -> Tuple[Kernels, str]:
    """Load the kernel cached in ``folder``, building it first (with ``cc``) if it is absent or
    damaged."""
    target = os.path.join(folder, library_name())
    if os.path.exists(target):
        try:
            return _load(target), target
        except OSError as exc:  # a file cut short (full disk, killed build): build it again
            if cc is None:
                raise BuildError(f"{target} does not load ({exc}) and {NO_COMPILER}") from None
            os.remove(target)
    if cc is None:
        raise BuildError(NO_COMPILER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    _compile(cc, target)
    return _load(target), target


def _probe() -> Tuple[List[float], List[float]]:
    """Values at every kind of rounding decision, and what numpy's float16 conversion makes of them."""
    import numpy as np

    values = np.array([0.1, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2049.0, 2051.0, 65504.0, 65519.0, 65520.0,
                       -7.0e4, 3.0e38, float("inf"), 2.0**-14, 2.0**-25, 3 * 2.0**-26, 2.0**-26, 1e-8,
                       1e-40, -1e-6, 0.0, 8.0, 12345.678], dtype=np.float32)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    return values.tolist(), expected.tolist()


def _bf16_probe() -> Tuple[List[float], List[float]]:
    """Values at every kind of bfloat16 rounding decision (8 significant bits), and their
    nearest-even bfloat16 values, written out (no numpy conversion to compare with)."""
    ulp, top = 2.0**-7, (2.0 - 2.0**-7) * 2.0**127  # the ulp at 1; the largest finite value
    inputs = [1.0 + ulp / 2, 1.0 + 3 * ulp / 2, 1.0 + ulp / 2 + 2.0**-20, 0.1, -3.0, top * (1 + 2.0**-9),
              (2.0 - 2.0**-8) * 2.0**127, 3.0e38, -float("inf"), 2.0**-133, 2.0**-134, 3 * 2.0**-134,
              2.0**-149, -0.0, 2.0**-126 - 2.0**-149]
    expected = [1.0, 1.0 + 2 * ulp, 1.0 + ulp, 0.10009765625, -3.0, top, float("inf"), 226 * 2.0**120,
                -float("inf"), 2.0**-133, 0.0, 2.0**-132, 0.0, -0.0, 2.0**-126]
    return inputs, expected


def _check(name: str, rounder: Rounder, probe: Tuple[List[float], List[float]]) -> None:
    values, expected = probe
    buffer = (ctypes.c_float * len(values))(*values)
    rounder(ctypes.addressof(buffer), ctypes.addressof(buffer), len(values))
    if list(buffer) != expected:
        raise BuildError(f"the built {name} kernel rounded a probe wrongly: {list(buffer)} != {expected}")


def _load(path: str) -> Kernels:
    lib = ctypes.CDLL(path)
    try:
        supported, kernels = lib.pae_fp16_supported, Kernels(lib.pae_round_fp16, lib.pae_round_bf16)
    except AttributeError as exc:  # a library from another source under this name
        raise BuildError(f"{path} lacks a rounding kernel: {exc}") from None
    supported.restype = ctypes.c_int
    supported.argtypes = []
    for rounder in kernels:
        rounder.restype = ctypes.c_int
        rounder.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    if not supported():
        raise BuildError("this CPU has no F16C instructions")
    _check("float16", kernels.fp16, _probe())
    _check("bfloat16", kernels.bf16, _bf16_probe())
    return kernels


_FAILURES = (BuildError, OSError, subprocess.SubprocessError)


def _build() -> Tuple[Optional[Kernels], str]:
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch in _OFF:
        return None, f"turned off by {ENV_SWITCH}={os.environ[ENV_SWITCH]}"
    if switch not in _ON:
        logger.warning("%s=%r is not one of 0/1 (or true/false, on/off, yes/no); the native kernel stays on.",
                       ENV_SWITCH, os.environ[ENV_SWITCH])
    if platform.machine().lower() not in _X86:
        return None, f"no F16C kernel for a {platform.machine()} CPU"
    cc = compiler()
    try:
        return _build_in(cc, cache_dir())
    except _FAILURES as exc:
        failure = str(exc)
    if cc is None:
        return None, failure
    # A folder not writable, a full disk, a library that does not load: once more in a private
    # temporary folder (maybe another file system), removed after loading (the mapping stays).
    logger.debug("building in %s failed (%s); building in a temporary folder", cache_dir(), failure)
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix="paddle_amp_ext-")
        kernels, _ = _build_in(cc, folder)
        return kernels, f"built in a temporary folder ({cache_dir()}: {failure})"
    except _FAILURES as exc:
        return None, failure if str(exc) == failure else f"{failure}; in a temporary folder: {exc}"
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _result() -> Tuple[Optional[Kernels], str]:
    kernels, detail = _build()
    if kernels is None:
        logger.info("fp16 rehearsal: the one-pass rounding kernels are not used (%s); Paddle's "
                    "kernels round exactly, several times slower per tensor.", detail)
    return kernels, detail


def fp16_rounder() -> Optional[Rounder]:
    """The loaded float16 kernel (built on the first call in a process), or None where it cannot be had."""
    kernels = _result()[0]
    return kernels.fp16 if kernels is not None else None


def bf16_rounder() -> Optional[Rounder]:
    """The loaded bfloat16 kernel, built and loaded with :func:`fp16_rounder`'s (so None where that is)."""
    kernels = _result()[0]
    return kernels.bf16 if kernels is not None else None


def status() -> NativeStatus:
    """Whether the native kernels are loaded, and the library's path or the reason they are not."""
    kernels, detail = _result()
    return NativeStatus(kernels is not None, detail)


def reset() -> None:
    """Forget the loaded kernel: the next call builds or loads again (after changing the
    environment, e.g. in tests)."""
    _result.cache_clear()
