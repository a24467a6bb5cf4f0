"""Where the rounding kernels are cached, under which names, and with which compiler.

A cached library's name says what it was built from: the source, the flags, the machine, the
Python ABI (:func:`build_description`) and the compiler (:func:`compiler_identity`: its resolved
path and ``--version``), so two Python installs or compilers sharing one HOME keep a library each.
Nothing here builds, loads or writes (see :mod:`.build`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
from typing import Any, Dict, List, Optional

ENV_CACHE = "PADDLE_AMP_EXT_CACHE_DIR"
ENV_SYSTEM = "PADDLE_AMP_EXT_SYSTEM_KERNEL_DIR"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp16round.c")
FLAGS = ("-O2", "-shared", "-fPIC")


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


def build_description() -> Dict[str, str]:
    """What a build depends on besides the compiler: the source's digest, the flags, the machine
    and the Python that loads it (its ABI tag)."""
    with open(SOURCE, "rb") as handle:
        source = hashlib.sha256(handle.read()).hexdigest()
    return {"source_sha256": source, "flags": " ".join(FLAGS), "machine": f"{sys.platform} {platform.machine()}",
            "python": f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}"}


def _key(data: Any, length: int) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:length]


def library_prefix() -> str:
    """The start of every cached file name for this build (:func:`build_description`)."""
    return f"fp16round-{_key(build_description(), 16)}-"


def library_name(identity: str) -> str:
    """The cached file's name: changes with the source, the flags, the machine, the Python ABI and
    the compiler (its path and ``--version``), so two Pythons or two compilers sharing one cache
    folder keep a library each instead of building over each other's."""
    return f"{library_prefix()}{_key(identity, 12)}.so"


def compiler_identity(cc: List[str]) -> str:
    """The compiler's resolved path, its arguments and the first line of its ``--version`` (one
    subprocess), as recorded with a build and hashed into its name."""
    cc = [os.path.realpath(shutil.which(cc[0]) or cc[0]), *cc[1:]]
    try:
        proc = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
        lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        lines = []
    return f"{' '.join(cc)}: {lines[0] if lines else 'no --version'}"


def system_dirs() -> List[str]:
    """Folders searched (never written) before the user's cache: ``$PADDLE_AMP_EXT_SYSTEM_KERNEL_DIR``
    (``os.pathsep``-separated), then ``<sys.prefix>/share/paddle_amp_ext``. An image builds the
    kernel there as root (:func:`install_system_kernel`); every uid may then load it."""
    explicit = [d for d in os.environ.get(ENV_SYSTEM, "").split(os.pathsep) if d]
    return [*explicit, os.path.join(sys.prefix, "share", "paddle_amp_ext")]


def candidates(folder: str, identity: Optional[str]) -> List[str]:
    """The libraries in ``folder`` this process may load: the one of this compiler, or, with no
    compiler (``identity`` None), any built for this build description (newest first)."""
    if identity is not None:
        return [os.path.join(folder, library_name(identity))]
    prefix = library_prefix()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".so")]
    except OSError:
        return []
    paths = [os.path.join(folder, n) for n in names]
    return sorted(paths, key=lambda p: os.lstat(p).st_mtime if os.path.lexists(p) else 0, reverse=True)
