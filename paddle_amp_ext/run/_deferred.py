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
#: How to install Paddle, for the messages that say it is missing (docs/install.md has the rest).
INSTALL_PADDLE = (
    "Install it as Paddle's install guide says (docs/install.md): on a GPU machine from Paddle's package "
    "index for your CUDA, e.g. pip install 'paddle-amp-ext[gpu]' --extra-index-url "
    "https://www.paddlepaddle.org.cn/packages/stable/cu126/ (CUDA 12.6; cu118, cu129 likewise); on a CPU "
    "pip install 'paddle-amp-ext[cpu]'; in the official Paddle Docker image it is already there."
)
CHECK_MODULES = ("paddle_amp_ext.check", "paddle_amp_ext.cli.check")
CHECK_SCRIPTS = ("paddle-amp-check", "paddle-amp-check-script.py", "paddle-amp-check.exe")
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
        if _state["completed"]:
            return False
        # the console script imports paddle_amp_ext.cli.run before argv[0] is touched
        deferred = _starting((RUN_MODULE,), RUN_SCRIPTS)
        _state["deferred"] = _state["deferred"] or deferred
        return deferred


def _starting(modules: tuple, scripts: tuple) -> bool:
    """True while ``python -m`` one of ``modules`` (or one of the console ``scripts``) imports the package."""
    if not sys.argv:
        return False
    if sys.argv[0] == "-m":
        return _module_of(list(getattr(sys, "orig_argv", ()))) in modules
    return os.path.basename(sys.argv[0]) in scripts


def check_without_paddle() -> bool:
    """True while ``python -m paddle_amp_ext.check`` (or ``paddle-amp-check``) starts where paddle
    cannot be imported: the package then imports nothing of Paddle's and ``check`` says what is
    missing (exit code 2) instead of a traceback. Python 3.10+ for ``-m`` (``sys.orig_argv``)."""
    if not _starting(CHECK_MODULES, CHECK_SCRIPTS):
        return False
    try:
        importlib.import_module("paddle")
    except ImportError:
        return True
    return False


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
