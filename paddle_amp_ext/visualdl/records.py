"""VisualDL's record file, written here without importing VisualDL.

A record file ``vdlrecords.<unix time>.log`` is a sequence of records, each a little-endian
uint64 length and a serialized ``visualdl.Record`` (VisualDL 2.5.3's ``record.proto``): first a
meta record, then one record per scalar. ``Record.values`` is field 1; ``Value`` has ``id`` (1,
varint), ``tag`` (2, bytes), ``timestamp`` (3, varint), ``value`` (4, float32) and
``meta_data`` (10, a message). The bytes written are those VisualDL's protobuf writes (the tests
compare them), so VisualDL's ``LogReader`` and dashboard read them.

VisualDL itself is not imported: its import creates ``~/.visualdl/conf``, which would be the one
file a hook writes outside its logdir (and fails where ``$HOME`` is not writable).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import time
from typing import Iterator, List, Optional, Tuple

from .._log import logger
from ..dashboards._wire import FileFormat, float32_bytes, varint

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks (no file is repaired, creations are not serialized)
    fcntl = None  # type: ignore[assignment]


_varint, _float32 = varint, float32_bytes  # the names this module had


def _framed(value: bytes) -> bytes:
    """``Record(values=[value])`` with its uint64 length in front."""
    record = b"\n" + _varint(len(value)) + value
    return struct.pack("<Q", len(record)) + record


def meta_record(walltime_ms: int) -> bytes:
    """The first record of a file, as VisualDL's ``meta_data(walltime=...)`` serializes it."""
    tag = b"meta_data_tag"
    stamp = b"\x18" + _varint(walltime_ms) if walltime_ms else b""
    return _framed(b"\x12" + _varint(len(tag)) + tag + stamp + b"R\x00")  # R = field 10: an empty MetaData


def _record_file_name(suffix: str) -> str:
    return f"vdlrecords.{int(time.time()):010d}.log{suffix}"


#: VisualDL's record file: how :class:`RecordFile` names and starts it
VISUALDL = FileFormat("vdlrecords.", _record_file_name, meta_record)


class ScalarEncoder:
    """Serialized scalar records, byte-identical to ``Record(values=[Value(...)])``.

    A record is its uint64 length, ``Record``'s field-1 key and length, then the ``Value``: the
    step, the tag, the timestamp and the float32. Everything but the float is computed once per
    tag and length of the step/timestamp varints, which makes a value ~10x cheaper than building
    the protobuf message.
    """

    def __init__(self) -> None:
        self._frames: dict = {}  # len(step and timestamp fields) -> {tag: (length and key bytes, tag field)}
        self._wall, self._tail = 0, b"%"  # the last step's timestamp and its field (with the float's key)

    def _frame(self, tag: str, size: int) -> Tuple[bytes, bytes]:
        raw = tag.encode("utf-8")
        field = b"\x12" + _varint(len(raw)) + raw
        body = size + len(field) + 4
        key = b"\n" + _varint(body)
        parts = self._frames[size][tag] = struct.pack("<Q", len(key) + body) + key, field
        return parts

    def step(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> bytes:
        head = b"\x08" + _varint(step) if step else b""  # proto3 leaves out zero scalars
        tail = self._tail
        if walltime_ms != self._wall:  # steps of the same millisecond share it
            self._wall, tail = walltime_ms, (b"\x18" + _varint(walltime_ms) if walltime_ms else b"") + b"%"
            self._tail = tail
        size = len(head) + len(tail)
        frames = self._frames.get(size)
        if frames is None:
            frames = self._frames[size] = {}
        out: list = []
        for tag, value in values:
            key, field = frames.get(tag) or self._frame(tag, size)
            out += (key, head, field, tail, _float32(value))
        return b"".join(out)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
#: a record file is always a new regular file: never an existing file, a link, a FIFO or a device
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


def _refuse(path: str, exc: OSError) -> OSError:
    return OSError(exc.errno, f"VisualDL hook will not write into {path!r}: it is a symbolic link or not a directory "
                              f"({exc.strerror}). A link in a shared logdir may point anywhere; remove it, or pass "
                              "another logdir or run_name.")


def split_existing(path: str) -> Tuple[str, List[str]]:
    """``path`` as (its deepest existing ancestor, the components below it that do not exist yet)."""
    base, missing = os.path.abspath(path), []
    while not os.path.lexists(base):
        base, name = os.path.split(base)
        missing.insert(0, name)
    return base, missing


def open_run_dir(base: str, parts: List[str]) -> int:
    """A descriptor of ``base/parts[0]/...``, each part created if missing and never followed if a link.

    ``base`` is the user's own path (followed as given); the parts below it are the hook's, made
    with ``mkdir`` and opened with ``O_NOFOLLOW`` relative to their parent (no window between a
    check and the use in which a planted link could redirect them).
    """
    fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    path = base
    try:
        for part in parts:
            path = os.path.join(path, part)
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise _refuse(path, exc) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


class RecordFile:
    """A record file created new (never an existing file or a link) and written in whole records.

    VisualDL's own ``LogWriter`` queues every scalar to a thread that opens and closes the file
    per record (~72 us a scalar); here a whole batch is one unbuffered ``write`` to the
    operating system, so what was written survives ``kill -9`` and an abort (the kernel holds it;
    only a crash of the machine itself needs an ``fsync``, which is not done). A batch is written
    whole or not at all: after a failed or interrupted write the file is cut back to its last
    whole record, because VisualDL's reader rejects a file that ends in a partial one.

    Security: the directories below ``base`` are created and opened without following links,
    and the file is opened with ``O_CREAT | O_EXCL | O_NOFOLLOW``: a link (or FIFO) planted in a
    shared, world-writable logdir never makes the hook create or write a file elsewhere.

    If the file is removed while open (its directory deleted mid-run), the next write notices
    (``st_nlink == 0``), re-creates the directories and a new file, warns, and goes on there.

    ``file_format`` names and starts the file: VisualDL's (:data:`VISUALDL`) or TensorBoard's event
    file (:data:`paddle_amp_ext.dashboards.tensorboard.FORMAT`), written the same way.
    """

    def __init__(self, base: str, parts: List[str], suffix: str, file_format: FileFormat = VISUALDL) -> None:
        self._base, self._parts, self._suffix, self._format = base, list(parts), suffix, file_format
        self.dir = os.path.join(base, *self._parts)
        self._fd = -1
        self._open_new()

    def _open_new(self) -> None:
        dir_fd = open_run_dir(self._base, self._parts)
        try:
            if self._format is VISUALDL:  # a file a killed writer left torn here: whole again (TensorBoard
                for entry in os.listdir(dir_fd):  # reads up to a torn record itself)
                    if entry.startswith(VISUALDL.prefix):
                        repair(entry, dir_fd, os.path.join(self.dir, entry))
            stamp = self._format.name(self._suffix)
            names = [stamp] + [f"{stamp}.{os.getpid()}.{n}" for n in range(100)]
            for name in names:  # two writers in one second and directory, or a planted entry: another name
                try:
                    fd = os.open(name, _FILE_FLAGS, 0o644, dir_fd=dir_fd)
                    break
                except FileExistsError:
                    continue
            else:
                raise OSError(errno.EEXIST, f"VisualDL hook found no free record file name in {self.dir!r}")
        finally:
            os.close(dir_fd)
        self.path = os.path.join(self.dir, name)
        self._fd, self._good = fd, 0
        _lock(fd, blocking=False)  # a live file: repair_records() leaves it alone
        self.write_bytes(self._format.header(round(time.time() * 1000)))

    def removed(self) -> bool:
        """True when the file was unlinked (its run directory or logdir removed) while open, or
        a re-creation after that failed (tried again at the next write)."""
        if self._fd < 0:
            return True
        try:
            return os.fstat(self._fd).st_nlink == 0
        except OSError:
            return False

    def reopen(self) -> str:
        """Re-create the run directory and a new record file after :meth:`removed`; the old path."""
        old = self.path
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._base, missing = split_existing(self._base)
        self._parts = missing + self._parts
        self._open_new()
        return old

    def write(self, chunks: List[bytes]) -> None:
        """Append the encoded steps ``chunks`` in one ``write`` (see :meth:`write_bytes`)."""
        self.write_bytes(b"".join(chunks))

    def write_bytes(self, data: bytes) -> None:
        """Append ``data`` whole, or raise with the file as it was before (also when a signal
        handler raises in the middle)."""
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                if not written:
                    raise OSError(errno.EIO, "the write made no progress")
                view = view[written:]
        except BaseException:
            try:
                os.ftruncate(self._fd, self._good)
                os.lseek(self._fd, self._good, os.SEEK_SET)
            except OSError as cut:  # pragma: no cover - a file that cannot even be cut back
                logger.warning("VisualDL hook could not cut %s back to its last whole record: %r", self.path, cut)
            raise
        self._good += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lock(fd: int, blocking: bool = True) -> bool:
    """``flock(LOCK_EX)`` on ``fd``: True once held; False when another open file holds it
    (``blocking=False``) or there are no locks here (Windows, some network mounts)."""
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        return False
    return True


_held: set = set()  # descriptors of the creation locks this process holds now


def _release_in_child() -> None:
    """A forked child closes its copies of the creation locks held at the fork: an ``flock`` lasts
    while any copy is open, and a long-lived child (a DataLoader worker) would hold it for good."""
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:  # pragma: no cover - closed already
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_in_child)


@contextlib.contextmanager
def creating_in(logdir: str) -> Iterator[None]:
    """Hold ``logdir``'s creation lock (``flock`` on the directory, created without following links
    if missing) while a writer picks its run directory and creates its record file: hooks started
    together, in threads or processes, never both find one run directory free. Where the lock
    cannot be had (an unwritable logdir), nothing is held: the writer then names the error."""
    try:
        fd = open_run_dir(*split_existing(logdir))
    except OSError:
        fd = -1
    try:
        if fd >= 0:
            _held.add(fd)
            _lock(fd)  # without locks (Windows, some network mounts) the writers are not serialized
        yield
    finally:
        if fd >= 0:
            _held.discard(fd)
            os.close(fd)  # releases the lock


_META_KEY = b"\x12" + _varint(len(b"meta_data_tag")) + b"meta_data_tag"


def _whole_length(fd: int, size: int) -> Optional[int]:
    """The length of the record file's whole records (its size, unless it ends in a partial one), or
    None when it does not begin with VisualDL's meta record (not a record file: left alone)."""
    head = os.pread(fd, 64, 0)
    if len(head) < 8 or 8 + struct.unpack("<Q", head[:8])[0] > size or _META_KEY not in head[8:32]:
        return None
    offset = 0
    while offset + 8 <= size:
        end = offset + 8 + struct.unpack("<Q", os.pread(fd, 8, offset))[0]
        if end > size:
            break
        offset = end
    return offset


def repair(path: str, dir_fd: Optional[int] = None, shown: Optional[str] = None) -> Optional[int]:
    """Cut a record file that ends in a partial record back to its last whole record.

    A writer killed by a signal that runs no Python (SIGKILL) in the middle of a large write can
    leave a partial record at the end (Linux stops a ``write`` at a page boundary), and VisualDL's
    reader rejects such a file whole. A file a live writer holds (its ``flock``; where there
    are no locks, any file), a link, anything but a regular file, and a file that does not begin
    with VisualDL's meta record are left alone.

    Args:
        path: the record file (relative to ``dir_fd`` when given).
        dir_fd: a descriptor of its directory, or None.
        shown: the path the warnings name (default ``path``).

    Returns:
        The bytes cut, or None when nothing was cut.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    shown = path if shown is None else shown
    try:
        info = os.fstat(fd)
        size = info.st_size
        if not stat.S_ISREG(info.st_mode) or not _lock(fd, blocking=False):
            return None
        whole = _whole_length(fd, size)
        if whole is None or whole == size:
            return None
        os.ftruncate(fd, whole)
    except OSError as exc:
        logger.warning("VisualDL records: could not repair %s: %r", shown, exc)
        return None
    finally:
        os.close(fd)
    logger.warning("VisualDL records: %s ended in a partial record (its writer was killed in the middle of a write): "
                   "cut back to its last whole record (%d bytes removed), so VisualDL reads it.", shown, size - whole)
    return size - whole


def repair_records(logdir: str) -> List[str]:
    """Repair every record file (``vdlrecords.*``) under ``logdir`` that a killed writer left with a
    partial last record (see :func:`repair`); ``visualdl_serve`` does this before serving.

    Files being written (a live hook holds them) are left alone; links are not followed.

    Args:
        logdir: a VisualDL log directory.

    Returns:
        The paths of the files repaired.

    Example:
        >>> repair_records("runs")  # doctest: +SKIP
        []
    """
    repaired = []
    for folder, _, names in os.walk(logdir):
        for name in sorted(names):
            path = os.path.join(folder, name)
            if name.startswith("vdlrecords.") and repair(path) is not None:
                repaired.append(path)
    return repaired
