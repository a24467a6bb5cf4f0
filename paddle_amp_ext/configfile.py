"""Reading an :class:`~paddle_amp_ext.config.AmpConfig` file: checked before it is read, decoded,
parsed, and its settings table found. Pure: no Paddle, nothing else of this package."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

#: The largest config file read (a config is a few hundred bytes).
MAX_BYTES = 1 << 20
#: The tables a shared project file may hold the settings in.
FORMAT_KEYS = ("amp", "paddle_amp_ext")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _check(info: os.stat_result, name: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((text for test, text in _KINDS if test(info.st_mode)), "not a regular file")
        raise ValueError(f"Config file {name!r} is {kind}, not a regular file: give the path of a .toml or .json file.")
    if info.st_size > MAX_BYTES:
        raise ValueError(f"Config file {name!r} is {_size(info.st_size)}; a config file may be at most "
                         f"{_size(MAX_BYTES)}: is this the right file?")


def read_bytes(path: Path) -> bytes:
    """The bytes of a config file, refused before anything is read when it is not a regular file
    (a device such as ``/dev/zero``, a named pipe, a directory: symbolic links followed) or is
    larger than :data:`MAX_BYTES`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a regular file, or too large (the message names the size and the limit).
    """
    name = str(path)
    _check(os.stat(path), name)  # before opening: opening a named pipe would wait for a writer
    with open(path, "rb") as handle:
        _check(os.fstat(handle.fileno()), name)  # the file opened, should the path have changed since
        raw = handle.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"Config file {name!r} grew beyond {_size(MAX_BYTES)} while being read.")
    return raw


def parse(path: Path) -> Any:
    """The parsed content of a ``.toml`` or ``.json`` file (:func:`read_bytes` first).

    Raises:
        FileNotFoundError: no such file.
        ValueError: refused by :func:`read_bytes`, not UTF-8, an unknown suffix, unparsable, or
            a JSON object with a key given twice (the message names the file and the key).
    """
    name = str(path)
    raw = read_bytes(path)
    try:
        text = raw.decode("utf-8-sig")  # a leading BOM is fine
    except UnicodeDecodeError as exc:
        raise ValueError(f"Config file {name!r} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
                         f"{exc.start}): save it as UTF-8.") from None
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise ValueError(f"Config file {name!r} has suffix {suffix!r}; use .toml or .json.")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys) if suffix == ".json" else _load_toml(text)
    except _DuplicateKeyError as exc:
        raise ValueError(f"Config file {name!r}: {exc}") from None
    except RecursionError:
        raise ValueError(f"Config file {name!r} is nested too deeply to be an AmpConfig.") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError, and so are TOML errors here
        raise ValueError(f"Config file {name!r} is not valid {suffix[1:]}: {exc}") from None


class _DuplicateKeyError(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """A JSON object as a dict, refusing a key given twice (JSON keeps the last silently; TOML refuses)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(f"key {key!r} is given twice (values {out[key]!r}, then {value!r}); JSON "
                                     "would keep the last silently: keep one")
        out[key] = value
    return out


def settings_table(data: Any) -> Any:
    """The settings of a parsed config file: top level, or an ``[amp]`` / ``[paddle_amp_ext]``
    table (other tables beside it, as in a shared project file, are not ours and are ignored)."""
    if not isinstance(data, dict):
        return data
    tables = [key for key in FORMAT_KEYS if isinstance(data.get(key), dict)]
    if not tables:
        return data
    if len(tables) > 1:
        raise ValueError(f"settings in both {tables}: keep one table.")
    loose = sorted(key for key, value in data.items() if not isinstance(value, dict))
    if loose:
        raise ValueError(f"settings both at top level {loose} and in [{tables[0]}]: put them all in [{tables[0]}].")
    return data[tables[0]]


def _load_toml(text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python < 3.11
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(str(exc)) from exc
