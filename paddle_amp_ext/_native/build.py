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
  compiler, then ``cc``) and no library built before (a system folder, :func:`system_dirs`, may
  hold one built as root for every uid: ``docker/Dockerfile.cpu`` builds it there with
  :func:`install_system_kernel`, then drops gcc);
- no usable cache folder and no temporary folder (the kernel is built in
  ``$PADDLE_AMP_EXT_CACHE_DIR``, else ``$XDG_CACHE_HOME/paddle_amp_ext`` or
  ``~/.cache/paddle_amp_ext``; failing that in a private temporary folder removed after
  loading);
- a library that does not round a probe exactly as numpy does (float16) or as the bfloat16
  values written out in :func:`.probes.bf16_probe` say, at every vector width it has code for
  (:data:`WIDTHS`).

The bfloat16 kernel (integer round-to-nearest-even on the bit pattern, AVX2 where the CPU has it)
is built and loaded with the float16 one, from the same file, under the same conditions; so are
the FP8 rehearsal's one-pass e4m3fn/e5m2 rounding with its saturated/flushed counts and amax
(:func:`fp8_kernel`, probed by :func:`.probes.wrong_fp8_answer`). Both
use AVX-512F where the CPU and the OS have it (:func:`vector_bits`).

Cached libraries are named by what they were built from: the source, the flags, the machine, the
Python ABI and the compiler (its resolved path and ``--version``), so two Python installs sharing
one HOME keep one library each instead of building over each other's. Without a compiler, any
library of this build (source, flags, machine, ABI) is taken. System folders are looked into
first and never written.

A cached library is loaded only after :mod:`.trust` has checked it: a folder and file nobody but
this user could have written (a cache folder others can write is not even looked into: the
kernel is built in a private temporary folder, with a warning once), and a SHA-256 recorded at
build time beside it that matches the file and this build. A library that fails any check, or
fails to load (cut short, missing a function, not a library), is built again once; where that
fails too, Paddle's kernels round.

:func:`status` says which, and why; ``python -m paddle_amp_ext.check`` shows it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._log import warn_once
from . import cache, probes, trust
from .cache import (  # noqa: F401 - the cache's names, as callers and tests know them (build.X)
    ENV_CACHE,
    ENV_SYSTEM,
    SOURCE,
    build_description,
    cache_dir,
    compiler,
    compiler_identity,
    library_name,
    library_prefix,
    system_dirs,
)

logger = logging.getLogger(__name__)

ENV_SWITCH = "PADDLE_AMP_EXT_NATIVE"
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")

#: ``rounder(src_ptr, dst_ptr, n)``: rounds ``n`` float32 values (``dst`` may be ``src``).
Rounder = Callable[[int, int, int], int]


@dataclass(frozen=True)
class NativeStatus:
    """Whether the one-pass kernel is in use, and where it came from or why not."""

    available: bool
    detail: str

    def __str__(self) -> str:
        return ("native F16C kernel: " if self.available else "Paddle kernels (13 passes): ") + self.detail


class BuildError(RuntimeError):
    """The kernel could not be built or loaded; the message says why."""


NO_COMPILER = "no C compiler found (set CC, or install gcc)"

#: The library's functions: name -> (restype, argtypes). A library lacking one is not used;
#: a new kernel function is one line here.
SYMBOLS: Dict[str, Tuple[Any, List[Any]]] = {
    "pae_fp16_supported": (ctypes.c_int, []),
    "pae_round_fp16": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]),
    "pae_round_bf16": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]),
    "pae_all_finite": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
    "pae_vector_bits": (ctypes.c_int, [ctypes.c_int]),
    "pae_fp8_quant": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "pae_fp8_block_amax": (ctypes.c_int, [ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_void_p]),
    "pae_fp8_quant_scaled": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_void_p,
                                            ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                            ctypes.c_void_p]),
    "pae_fp8_quant_cols": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 3, ctypes.c_void_p,
                                          ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                          ctypes.c_void_p]),
    "pae_fp8_quant_both": (ctypes.c_int, [*[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 3, *[ctypes.c_void_p] * 2,
                                          ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                          *[ctypes.c_void_p] * 3]),
}
#: The vector widths the roundings have code for (``pae_vector_bits``), each probed at load.
WIDTHS = (512, 256, 128)
#: The loaded library's functions, by name (those of :data:`SYMBOLS`).
Kernel = Dict[str, Any]
#: A loaded library and its path.
Found = Tuple[Kernel, str]


class UnsupportedCPUError(BuildError):
    """The library loads but this CPU cannot run it: building again would not help."""


#: What loading or verifying a library raises (a missing function: AttributeError; a bad
#: record: ValueError); and what building one may raise besides.
_LOAD_FAILURES = (BuildError, trust.UntrustedError, OSError, AttributeError, ValueError)
_FAILURES = (*_LOAD_FAILURES, subprocess.SubprocessError)


def _compile(cc: List[str], target: str, identity: str) -> Kernel:
    """Compile to a temporary name in ``target``'s folder, load and probe that file, record its
    digest, then rename it to ``target``: concurrent builds (one per rank of a launch) never see
    a half-written or unverified library."""
    handle, partial = tempfile.mkstemp(prefix=".fp16round-", suffix=".so", dir=os.path.dirname(target))
    os.close(handle)
    try:
        proc = subprocess.run([*cc, *cache.FLAGS, "-o", partial, SOURCE], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cc)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
        os.chmod(partial, 0o755)  # whatever the umask: writable by this user only
        kernel = _load(partial)
        trust.write_record(partial, {**cache.build_description(), "compiler": identity}, trust.record_path(target))
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return kernel


def _cached(folder: str, identity: Optional[str], allow_root: bool = False) -> Tuple[Optional[Found], Optional[str]]:
    """The first library of this build in ``folder`` (a real path) that :mod:`.trust` accepts
    (root's too with ``allow_root``) and that loads, and else why the first one there was not
    loaded (None: there is none). Writes nothing.

    Raises:
        UntrustedError: someone else could write into ``folder``: nothing in it is opened.
        UnsupportedCPUError: a library loads but this CPU cannot run it (none built here would).
    """
    if not os.path.isdir(folder):
        return None, None
    trust.check_folder(folder, allow_root=allow_root)
    stale = None
    for path in cache.candidates(folder, identity):
        if not os.path.lexists(path):
            continue
        try:
            trust.verify(path, cache.build_description(), identity, allow_root=allow_root)
            return (_load(path), path), None
        except UnsupportedCPUError:
            raise
        except _LOAD_FAILURES as exc:  # cut short, damaged, foreign, built otherwise
            stale = stale or f"{path} was not loaded: {exc}"
    return None, stale


def _build_in(cc: Optional[List[str]], folder: str) -> Found:
    """The kernel cached in ``folder`` once it is verified (:mod:`.trust`), else built there once
    (with ``cc``); returns it and the library's path (and why it was built again).

    Raises:
        UntrustedError: someone else could write into ``folder``: nothing in it is opened.
        BuildError, OSError: it cannot be built there (the message says why).
    """
    folder = os.path.realpath(folder)
    identity = None if cc is None else cache.compiler_identity(cc)
    found, stale = _cached(folder, identity)
    if found is not None:
        return found
    if cc is None or identity is None:
        raise BuildError(f"{stale}, and {NO_COMPILER}" if stale else NO_COMPILER)
    target = os.path.join(folder, cache.library_name(identity))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    trust.check_folder(folder)  # made just now: its parents decide
    try:
        kernel = _compile(cc, target, identity)
    except _FAILURES as exc:
        if stale is None:
            raise
        raise BuildError(f"{stale}; building it again failed: {exc}") from None
    return kernel, target if stale is None else f"{target} (built again: {stale})"


def _from_system() -> Optional[Found]:
    """A library from :func:`system_dirs` that :mod:`.trust` accepts for any uid (root's or this
    user's, in folders nobody else can write), or None; a refused one is only logged."""
    for folder in cache.system_dirs():
        try:
            found, refused = _cached(os.path.realpath(folder), None, allow_root=True)
        except (trust.UntrustedError, UnsupportedCPUError) as exc:
            logger.debug("kernel folder %s is not used: %s", folder, exc)
            continue
        if found is not None:
            return found
        logger.debug("kernel folder %s: %s", folder, refused or "no library of this build")
    return None


def install_system_kernel(folder: Optional[str] = None) -> NativeStatus:
    """Build the kernel into ``folder`` (default: the last of :func:`system_dirs`), readable by
    every uid and writable by this user only; run by an image's build as root (docker/Dockerfile.cpu).

    Returns:
        Where it was built, or why it was not.
    """
    folder = os.path.realpath(folder or cache.system_dirs()[-1])
    cc = cache.compiler()
    if cc is None:
        return NativeStatus(False, NO_COMPILER)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    try:
        _, path = _build_in(cc, folder)
    except _FAILURES as exc:
        return NativeStatus(False, str(exc))
    return NativeStatus(True, path)


def _load(path: str) -> Kernel:
    """``ctypes.CDLL(path)`` (its constructors run now: callers verify it first), every function
    of :data:`SYMBOLS` bound, and both roundings probed (:mod:`.probes`).

    Raises:
        OSError: not a loadable library. AttributeError: a function is missing.
        UnsupportedCPUError: no F16C on this CPU. BuildError: the probe came out wrong.
    """
    lib = ctypes.CDLL(path)
    kernel: Kernel = {}
    for name, (restype, argtypes) in SYMBOLS.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
        kernel[name] = function
    if not kernel["pae_fp16_supported"]():
        raise UnsupportedCPUError("this CPU has no F16C instructions")
    for width in reversed(WIDTHS):  # every path this CPU can take; the widest last, and kept
        kernel["pae_vector_bits"](width)
        for name, symbol, probe in (("float16", "pae_round_fp16", probes.fp16_probe()),
                                    ("bfloat16", "pae_round_bf16", probes.bf16_probe())):
            wrong = probes.wrong_answer(kernel[symbol], probe)
            if wrong:
                raise BuildError(f"the built {name} kernel ({width}-bit vectors at most) rounded a probe "
                                 f"wrongly: {wrong}")
        wrong = probes.wrong_fp8_answer(*_fp8_functions(kernel))
        if wrong:
            raise BuildError(f"the built FP8 kernel ({width}-bit vectors at most) answered a probe wrongly: {wrong}")
    wrong = probes.wrong_finite_answer(kernel["pae_all_finite"])
    if wrong:
        raise BuildError(f"the built finiteness scan answered a probe wrongly: {wrong}")
    return kernel


def _not_here() -> Optional[str]:
    """Why no kernel is tried at all (turned off, not x86), or None."""
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch in _OFF:
        return f"turned off by {ENV_SWITCH}={os.environ[ENV_SWITCH]}"
    if switch not in _ON:
        logger.warning("%s=%r is not one of 0/1 (or true/false, on/off, yes/no); the native kernel stays on.",
                       ENV_SWITCH, os.environ[ENV_SWITCH])
    if platform.machine().lower() not in _X86:
        return f"no F16C kernel for a {platform.machine()} CPU"
    return None


NOT_BUILT = ("not built yet: it is built at the first fp16 rehearsal in this cache folder "
             "(python -m paddle_amp_ext.check --build-kernel builds it now)")


def cached_status() -> NativeStatus:
    """What :func:`status` would load without building or writing anything: the kernel already
    loaded in this process, a verified one in :func:`system_dirs` or the cache folder, or
    :data:`NOT_BUILT` (``python -m paddle_amp_ext.check`` shows this)."""
    if _result.cache_info().currsize:
        return status()
    reason = _not_here()
    if reason is not None:
        return NativeStatus(False, reason)
    installed = _from_system()
    if installed is not None:
        return NativeStatus(True, installed[1])
    cc = cache.compiler()
    try:
        found, stale = _cached(os.path.realpath(cache.cache_dir()), None if cc is None else cache.compiler_identity(cc))
    except UnsupportedCPUError as exc:
        return NativeStatus(False, str(exc))
    except trust.UntrustedError as exc:
        return NativeStatus(False, f"{NOT_BUILT}; {exc}")
    if found is not None:
        return NativeStatus(True, found[1])
    detail = NOT_BUILT if cc is not None else f"{NOT_BUILT}, but {NO_COMPILER}"
    return NativeStatus(False, detail if stale is None else f"{detail}; {stale}")


def _build() -> Tuple[Optional[Kernel], str]:
    reason = _not_here()
    if reason is not None:
        return None, reason
    installed = _from_system()
    if installed is not None:
        return installed
    cc = cache.compiler()
    try:
        return _build_in(cc, cache.cache_dir())
    except UnsupportedCPUError as exc:
        return None, str(exc)
    except trust.UntrustedError as exc:
        failure = where = f"{exc}: a library there could have been planted, so nothing in it is loaded"
        warn_once(f"native-untrusted:{cache.cache_dir()}", "fp16 rehearsal kernel cache: %s; %s. Set %s to a "
                  "folder only you can write.", failure, "building in a private temporary folder"
                  if cc is not None else "no C compiler to build elsewhere", ENV_CACHE)
        if cc is None:
            return None, f"{failure}, and {NO_COMPILER}"
    except _FAILURES as exc:
        failure, where = str(exc), f"{cache.cache_dir()}: {exc}"
        if cc is None:
            return None, failure
    # A folder not writable or not ours, a full disk: once more in a private temporary folder
    # (maybe another file system), removed after loading (the mapping stays).
    logger.debug("building in %s failed (%s); building in a temporary folder", cache.cache_dir(), failure)
    folder = None
    try:
        folder = trust.private_folder()
        kernel, _ = _build_in(cc, folder)
        return kernel, f"built in a temporary folder ({where})"
    except UnsupportedCPUError as exc:
        return None, str(exc)
    except _FAILURES as exc:
        return None, failure if str(exc) == failure else f"{failure}; in a temporary folder: {exc}"
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _result() -> Tuple[Optional[Kernel], str]:
    kernel, detail = _build()
    if kernel is None:
        logger.info("fp16 rehearsal: the one-pass rounding kernel is not used (%s); Paddle's "
                    "kernels round exactly, about 7x slower per tensor.", detail)
    return kernel, detail


def fp16_rounder() -> Optional[Rounder]:
    """The loaded kernel (built or verified and loaded on the first call in a process), or None
    where it cannot be had."""
    kernel = _result()[0]
    return None if kernel is None else kernel["pae_round_fp16"]


def bf16_rounder() -> Optional[Rounder]:
    """The loaded bfloat16 kernel, built and loaded with :func:`fp16_rounder`'s (so None where that is)."""
    kernel = _result()[0]
    return None if kernel is None else kernel["pae_round_bf16"]


#: ``scan(src_ptr, n)``: 1 when none of ``n`` float32 values is inf or nan, else 0.
Scanner = Callable[[int, int], int]


def finite_scanner() -> Optional[Scanner]:
    """The loaded finiteness scan, built and loaded with :func:`fp16_rounder`'s (so None where that is)."""
    kernel = _result()[0]
    return None if kernel is None else kernel["pae_all_finite"]


#: ``quant(src, dst, rows, cols, block_rows, block_cols, scales, fmt, dequant, counts, amax)``,
#: ``amax_of(src, rows, cols, block_rows, block_cols, amax)``, ``quant_scaled(src, dst, rows,
#: cols, block_rows, block_cols, scales_out, fmt, epsilon, pow2, dequant, counts, amax)`` and
#: ``quant_cols(src, dst, rows, cols, block_rows, scales_out, fmt, epsilon, pow2, dequant, counts,
#: amax)`` (blocks one column wide), ``quant_both(src, dst_rows, dst_cols, rows, cols, block,
#: scales_rows_out, scales_cols_out, fmt, epsilon, pow2, dequant, counts, amax, scale_range)``
#: (``quant_scaled`` in 1 x block blocks, then ``quant_cols``, in one call; the rows' scales'
#: smallest and largest): see ``pae_fp8_quant`` and the functions
#: after it in the C file.
Fp8Kernel = Tuple[Callable[..., int], Callable[..., int], Callable[..., int], Callable[..., int], Callable[..., int]]


def _fp8_functions(kernel: Kernel) -> Fp8Kernel:
    return (kernel["pae_fp8_quant"], kernel["pae_fp8_block_amax"], kernel["pae_fp8_quant_scaled"],
            kernel["pae_fp8_quant_cols"], kernel["pae_fp8_quant_both"])


def fp8_kernel() -> Optional[Fp8Kernel]:
    """The one-pass FP8 rounding (with its saturated/flushed counts and amax), the per-block
    amax, and both with the scales between them, built and loaded with :func:`fp16_rounder`'s
    (so None where that is)."""
    kernel = _result()[0]
    return None if kernel is None else _fp8_functions(kernel)


def vector_bits(limit: int = 0) -> Optional[int]:
    """The widest vectors the loaded roundings use (512: AVX-512F; 256: AVX2 and F16C; 128: plain
    C for bfloat16), None without the kernel; with ``limit`` (512, 256 or 128), first cap them at
    that for this process (the tests take every path on one CPU)."""
    kernel = _result()[0]
    return None if kernel is None else int(kernel["pae_vector_bits"](limit))


def status() -> NativeStatus:
    """Whether :func:`fp16_rounder` gives a kernel, and the library's path or the reason it does not."""
    kernel, detail = _result()
    return NativeStatus(kernel is not None, detail)


def reset() -> None:
    """Forget the loaded kernel: the next call builds or loads again (after changing the
    environment, e.g. in tests)."""
    _result.cache_clear()
