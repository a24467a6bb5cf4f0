"""Whether the package waits for the script to import paddle: ``python -m paddle_amp_ext.run``.

``python -m paddle_amp_ext.run`` imports this package before ``run`` starts; were it to import
paddle then, the script's own import order would change (on Paddle 2.6.2, paddle loaded before
PIL breaks PNG decoding in DataLoader threads). So while ``run`` starts, ``__init__`` imports
nothing of Paddle's and the package's names are completed (the module re-executed by
:func:`importlib.reload`, which keeps its submodules) when the script first imports paddle, or
first asks the package for a name. A false "starting" (another ``-m`` module named
``paddle_amp_ext.run`` on the command line) only delays the imports: every name still resolves.

Relies on CPython's start-up: under ``-m``, ``sys.argv[0]`` is ``"-m"`` until :mod:`runpy` has
imported the module's package, and ``sys.orig_argv`` (3.10+) holds the command line; a console
script's ``sys.argv[0]`` is its own path while it imports its entry point.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import List, Optional

RUN_MODULE = "paddle_amp_ext.run"
RUN_SCRIPTS = ("paddle-amp-run", "paddle-amp-run-script.py", "paddle-amp-run.exe")
_PACKAGE = "paddle_amp_ext"
_lock = threading.RLock()
_state = {"deferred": False, "completed": False}


def _module_of(argv: List[str]) -> Optional[str]:
    """The module a ``python [options] -m MODULE`` command line names, or None."""
    items = iter(argv[1:])
    for arg in items:
        if arg == "-m":
            return next(items, None)
        if arg.startswith("-m"):
            return arg[2:]
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            next(items, None)  # their value
        elif not arg.startswith("-"):
            return None  # a script path: no -m
    return None


def starting_run() -> bool:
    """True while ``python -m paddle_amp_ext.run`` (or the ``paddle-amp-run`` console script)
    imports the package, before completion; the package then defers its imports (see the module
    docstring)."""
    with _lock:
        if _state["completed"] or not sys.argv:
            return False
        if sys.argv[0] == "-m":
            deferred = _module_of(list(getattr(sys, "orig_argv", ()))) == RUN_MODULE
        else:  # the console script, which imports paddle_amp_ext.cli.run before argv[0] is touched
            deferred = os.path.basename(sys.argv[0]) in RUN_SCRIPTS
        _state["deferred"] = _state["deferred"] or deferred
        return deferred


def complete() -> None:
    """Run the rest of the package's ``__init__`` if it was deferred (imports paddle); idempotent."""
    with _lock:
        if _state["completed"]:
            return
        _state["completed"] = True
        if _state["deferred"] and _PACKAGE in sys.modules:
            importlib.reload(sys.modules[_PACKAGE])


def deferred_getattr(name: str) -> object:
    """The deferred package's ``__getattr__``: a submodule is imported (no completion: the
    package's own ``from . import configfile`` asks for it so); any other name completes the
    package, then is looked up."""
    if name == "__all__" or not name.startswith("__"):
        if importlib.util.find_spec(f"{_PACKAGE}.{name}") is not None:  # a submodule (``from . import x``)
            return importlib.import_module(f"{_PACKAGE}.{name}")  # what it imports, it imports
        complete()
        namespace = vars(sys.modules[_PACKAGE])
        if name in namespace:
            return namespace[name]
        full = namespace.get("__getattr__")
        if full is not None and full is not deferred_getattr:  # the completed package's own
            return full(name)
    raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
