"""Run a Python script as ``python script.py args...`` would, inside this process.

Shared by ``python -m paddle_amp_ext.doctor`` and ``python -m paddle_amp_ext.run``. The start is
CPython's (3.9+, checked against 3.11's ``python script.py``): the script runs as ``__main__``
with an absolute ``__file__``, ``sys.argv[0]`` as given, a ``SourceFileLoader`` and no
``__spec__``; ``sys.path[0]`` is the folder of the file a symlinked script points to; a folder
or a zip file runs its ``__main__.py`` (``python pkgdir``), ``-m MODULE`` a module
(:func:`run_module_as_main`, ``python -m MODULE``), and any readable file runs (``/dev/null``
is an empty script). Under ``-P`` or ``-I`` nothing is put on ``sys.path``. However the script
ends, the caller gets its exit code back.

A command started from the command line calls :func:`claim_start_entry` first: the interpreter
put the command's own folder (or, for ``-m``, the current one) at ``sys.path[0]``, and the
script's entry replaces it, so ``sys.path`` is exactly what ``python script.py`` has.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import marshal
import os
import pkgutil
import runpy
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

_claimed: List[str] = []  # sys.path[0] as the interpreter put it for the command (claim_start_entry)


@dataclass(frozen=True)
class ScriptEnd:
    """How a script ended: ``exit_code`` as ``python script.py`` would exit (0 normally or for
    ``sys.exit()``, ``n`` for ``sys.exit(n)``, 1 for an exception or for ``sys.exit(obj)`` with
    any other object), the exception it raised (not SystemExit), and ``exit_message``: what
    Python prints on stderr for ``sys.exit(obj)`` (``str(obj)``: ``sys.exit("no data")``,
    ``sys.exit(3.5)``), else None."""

    exit_code: int
    error: Optional[BaseException] = None
    exit_message: Optional[str] = None


class NothingToRunError(FileNotFoundError):
    """The script, folder or module names nothing Python could run (a usage error)."""


def claim_start_entry() -> None:
    """Say that ``sys.path[0]`` is the entry the interpreter put there for the running command
    (called by a command's ``main()`` run from the command line); the script's entry replaces it."""
    if _start_entry_added() and sys.path:
        _claimed[:] = [sys.path[0]]


def check_script(path: str) -> None:
    """Raise :class:`NothingToRunError` naming ``path`` unless ``python path`` would run something.

    A file of any kind runs (a FIFO, ``/dev/null``: an empty script), as does a folder or zip
    file with a ``__main__.py``.
    """
    if not os.path.exists(path):
        raise NothingToRunError(f"No such script: {path!r}")
    if os.path.isdir(path) and _main_of(path) is None:
        raise NothingToRunError(f"{path!r} is a folder without a __main__.py: nothing to run (python runs a "
                                "folder's __main__.py; pass the script inside it).")
    if not os.access(path, os.R_OK):
        raise NothingToRunError(f"Cannot read the script {path!r} (permission denied).")


def end_of(exc: SystemExit) -> ScriptEnd:
    """The end ``sys.exit(code)`` makes, as Python's own handling of SystemExit: None exits 0,
    an int exits with it, anything else is printed (``str``) and exits 1."""
    code = exc.code
    if code is None:
        return ScriptEnd(0)
    if isinstance(code, int):
        return ScriptEnd(int(code))  # sys.exit(True) is 1
    return ScriptEnd(1, exit_message=str(code))


def run_as_main(path: str, argv: List[str]) -> ScriptEnd:
    """Run ``path`` as ``python path argv...`` would, as ``__main__``; exceptions are caught.

    A ``BaseException`` that is not ``SystemExit`` (KeyboardInterrupt, a caller's stop signal)
    propagates after ``sys.argv``, ``sys.path`` and ``sys.modules['__main__']`` are restored.

    Raises:
        NothingToRunError: ``path`` names nothing to run (see :func:`check_script`).
    """
    check_script(path)
    spec = _main_of(path)
    if spec is not None:  # a folder or a zip file: its __main__.py, with the folder as sys.path[0]
        return _run(lambda: _exec(spec.loader.get_code("__main__"), _spec_globals(spec)), path, argv, _absolute(path))
    filename = _absolute(path)
    entry = os.path.dirname(os.path.realpath(path))  # a symlink's target's folder, as CPython's
    return _run(lambda: _exec(_code_of(path, filename), _file_globals(filename)), path, argv, entry)


def run_module_as_main(name: str, argv: List[str]) -> ScriptEnd:
    """Run module ``name`` as ``python -m name argv...`` would (a package: its ``__main__``).

    The current folder is ``sys.path[0]`` and ``sys.argv[0]`` the module's file, as with ``-m``;
    finding the module imports its parent packages, as ``-m`` does.

    Raises:
        NothingToRunError: no module ``name``, or a package without ``__main__``.
    """
    def found(module: str) -> Any:
        try:
            return importlib.util.find_spec(module)
        except ModuleNotFoundError:
            return None

    def run() -> None:
        spec = found(name)
        if spec is None:
            raise NothingToRunError(f"No module named {name!r} (for -m {name}): check the name and sys.path.")
        if spec.submodule_search_locations is not None and found(f"{name}.__main__") is None:
            raise NothingToRunError(f"{name!r} is a package without a __main__ module: it cannot be run with -m.")
        runpy.run_module(name, {"__annotations__": {}}, run_name="__main__", alter_sys=True)

    return _run(run, "-m", argv, os.getcwd())


# --------------------------------------------------------------------------- plumbing
def _start_entry_added() -> bool:
    """Whether the interpreter puts a script's folder on ``sys.path`` (not under ``-P``/``-I``)."""
    return not (sys.flags.isolated or getattr(sys.flags, "safe_path", False))


def _run(body: Callable[[], None], argv0: str, argv: List[str], entry: str) -> ScriptEnd:
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [argv0, *argv]
    if _start_entry_added():
        if _claimed and sys.path and sys.path[0] == _claimed[0]:
            sys.path[0] = entry
        else:
            sys.path.insert(0, entry)
    try:
        body()
    except SystemExit as exc:
        return end_of(exc)
    except NothingToRunError:
        raise
    except Exception as exc:  # the script failed: the caller reports it
        return ScriptEnd(1, exc)
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    return ScriptEnd(0)


def _absolute(path: str) -> str:
    """``path`` made absolute as CPython makes a script's: joined to the current folder, not normalized."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _main_of(path: str) -> Any:
    """The spec of ``__main__`` in folder or zip file ``path``; None for a plain file or a folder without it."""
    if not os.path.isdir(path) and not _is_zip(path):
        return None
    importer = pkgutil.get_importer(_absolute(path))
    find = getattr(importer, "find_spec", None)
    spec = find("__main__") if find is not None else None
    return spec if spec is not None and spec.loader is not None else None


def _is_zip(path: str) -> bool:
    import zipfile

    try:
        return os.path.isfile(path) and zipfile.is_zipfile(path)
    except OSError:
        return False


def _code_of(path: str, filename: str) -> types.CodeType:
    """The code of a source or compiled (``.pyc``) script; its own ``from __future__`` only."""
    with open(path, "rb") as file:
        data = file.read()
    if data[:4] == importlib.util.MAGIC_NUMBER:
        return marshal.loads(data[16:])
    return compile(data, filename, "exec", dont_inherit=True)


def _file_globals(filename: str) -> Dict[str, Any]:
    loader_type = importlib.machinery.SourceFileLoader
    if filename.endswith(".pyc"):
        loader_type = importlib.machinery.SourcelessFileLoader
    return {"__file__": filename, "__cached__": None, "__loader__": loader_type("__main__", filename),
            "__package__": None, "__spec__": None}


def _spec_globals(spec: Any) -> Dict[str, Any]:
    return {"__file__": spec.origin, "__cached__": spec.cached, "__loader__": spec.loader, "__package__": "",
            "__spec__": spec}


def _exec(code: types.CodeType, names: Dict[str, Any]) -> None:
    """Execute ``code`` in a fresh ``__main__`` module (in ``sys.modules`` while it runs)."""
    module = types.ModuleType("__main__")
    vars(module).update(names, __builtins__=builtins, __annotations__={})  # as CPython's __main__ starts
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, vars(module))
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
