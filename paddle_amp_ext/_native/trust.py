"""Whether a cached kernel library may be loaded: who could have written it, and is it what was built.

``ctypes.CDLL`` runs a library's constructors as the calling user before any Python code can look
at it, so a library is loaded only when

- its folder, resolved through symbolic links, is owned by the current user and writable by
  nobody else, and every folder above it is owned by the user or root and writable by nobody
  else unless sticky (as ``/tmp`` is: there nobody can move another user's entries);
- the library file and its record beside it (``<name>.json``) are regular files owned by the
  user and writable by nobody else;
- the library's SHA-256, read from the same open file, is the one recorded when it was built,
  and the record describes this build: the source's digest, the flags, the machine and, where a
  compiler is present, that compiler's identity (a library built where a compiler was loads
  where there is none, as in ``docker/Dockerfile.cpu``).

In a system folder (``PADDLE_AMP_EXT_SYSTEM_KERNEL_DIR``, ``<sys.prefix>/share/paddle_amp_ext``,
read only) root's files count as the user's (``allow_root``): an image's build made them as root,
and root could replace the interpreter itself; nobody else's are accepted, and the folder itself
must not be writable by others even when sticky.

A digest read beside the library guards against files cut short or damaged (a truncated library
kills the process with SIGBUS when it is mapped), not against the user themselves: only the user
can write there. POSIX only: on Windows (no owners in ``os.stat``) every folder is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from typing import Any, Dict, Optional

#: The owner whose files every uid trusts (only in system folders, ``allow_root``): root.
ROOT_UID = 0
#: The largest record read back (a record is a few hundred bytes).
_RECORD_LIMIT = 64 * 1024


class UntrustedError(RuntimeError):
    """A file or folder someone other than the current user could have written; the message says who."""


def _who_could_write(info: os.stat_result, what: str, allow_root: bool,
                     sticky_ok: Optional[bool] = None) -> Optional[str]:
    """Who besides this user (and root, with ``allow_root``) could write ``info``'s file or folder;
    a sticky folder's other writers count only where ``sticky_ok`` (default: ``allow_root``)."""
    uid = os.geteuid()
    if info.st_uid != uid and not (allow_root and info.st_uid == ROOT_UID):
        return f"{what} is owned by uid {info.st_uid}, not by this user (uid {uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if not ((allow_root if sticky_ok is None else sticky_ok) and info.st_mode & stat.S_ISVTX):
            kind = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
            return f"{what} is writable by {kind} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def check_folder(folder: str, allow_root: bool = False) -> None:
    """Return when only the current user could have put files in ``folder`` (an absolute path,
    symbolic links already resolved); with ``allow_root``, root too (a system folder that an
    image's build filled as root, read by any uid).

    Raises:
        UntrustedError: naming the folder (or the one above it) and who else could write there.
    """
    if not hasattr(os, "geteuid"):
        raise UntrustedError(f"{folder}: file owners cannot be checked on this system")
    try:
        problem = _who_could_write(os.stat(folder), folder, allow_root=allow_root, sticky_ok=False)
        parent = os.path.dirname(folder)
        while problem is None and parent != folder:
            folder, parent = parent, os.path.dirname(parent)
            problem = _who_could_write(os.stat(folder), f"{folder} (above the cache folder)", allow_root=True)
    except OSError as exc:
        problem = f"{folder} cannot be checked ({exc})"
    if problem is not None:
        raise UntrustedError(problem)


def private_folder() -> str:
    """A new folder only this user can write (``tempfile.mkdtemp``), checked like the cache folder.

    Raises:
        UntrustedError: the temporary folder's parent lets others move it (then it is removed).
        OSError: no temporary folder can be made.
    """
    folder = os.path.realpath(tempfile.mkdtemp(prefix="paddle_amp_ext-"))
    try:
        check_folder(folder)
    except UntrustedError:
        os.rmdir(folder)
        raise
    return folder


def _open_own(path: str, allow_root: bool = False) -> int:
    """A read-only descriptor of ``path``, a regular file of this user (or root's, with
    ``allow_root``) that nobody else can write."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedError(f"{path} is not a regular file")
        problem = _who_could_write(info, path, allow_root=allow_root, sticky_ok=False)
        if problem is not None:
            raise UntrustedError(problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_digest(path: str, allow_root: bool = False) -> str:
    """The SHA-256 (hex) of ``path``, read through one descriptor after checking who owns it.

    Raises:
        UntrustedError: not a regular file, another user's, or writable by others.
        OSError: it cannot be read (a symbolic link: ``ELOOP``).
    """
    fd = _open_own(path, allow_root)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def record_path(library: str) -> str:
    """Where the record of ``library`` is kept: beside it, ``<name>.json``."""
    return os.path.splitext(library)[0] + ".json"


def write_record(library: str, build: Dict[str, Any], record: str) -> None:
    """Write ``record`` (a path) for the library file at ``library``: its digest and ``build``,
    through a temporary file renamed into place, readable by all, writable only by this user."""
    text = json.dumps({"library_sha256": file_digest(library), **build}, indent=1, sort_keys=True)
    handle, partial = tempfile.mkstemp(prefix=".fp16round-", suffix=".json", dir=os.path.dirname(record))
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, record)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def verify(library: str, build: Dict[str, Any], compiler_identity: Optional[str], allow_root: bool = False) -> None:
    """Check ``library`` against its record before it is loaded (see the module docstring).

    Args:
        library: the library's path.
        build: what the record must say (source digest, flags, machine).
        compiler_identity: the compiler present now, or None (no compiler: any identity passes).
        allow_root: root's files are accepted too (a system folder, see :func:`check_folder`).

    Raises:
        UntrustedError: the library or record could be another user's work.
        ValueError: no record, an unreadable record, or a digest or build that differs (named).
        OSError: a file cannot be read.
    """
    record = record_path(library)
    if not os.path.lexists(record):
        raise ValueError(f"it has no record of its build ({os.path.basename(record)})")
    fd = _open_own(record, allow_root)
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(_RECORD_LIMIT + 1)
    try:
        saved = json.loads(raw.decode("utf-8")) if len(raw) <= _RECORD_LIMIT else None
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        raise ValueError(f"its record {os.path.basename(record)} is not a build record")
    for key, value in build.items():
        if saved.get(key) != value:
            raise ValueError(f"it was built with {key}={saved.get(key)!r}, not {value!r}")
    if compiler_identity is not None and saved.get("compiler") != compiler_identity:
        raise ValueError(f"it was built by {saved.get('compiler')!r}, not by the compiler here ({compiler_identity!r})")
    actual = file_digest(library, allow_root)
    if actual != saved.get("library_sha256"):
        size = os.path.getsize(library)
        raise ValueError(f"its SHA-256 is {actual[:16]}..., not the {str(saved.get('library_sha256'))[:16]}... "
                         f"recorded when it was built ({size} bytes: cut short or changed since)")
