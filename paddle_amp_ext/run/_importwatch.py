"""Run a callback right after a module's first import, wherever it happens (``sys.meta_path``).

``python -m paddle_amp_ext.run`` routes ``paddle.amp`` when the script itself first imports
paddle, so the script's import order is its own (issue 30). The watcher finds the module's spec
with the finders after it, wraps the loader so that the callback runs once the module's code has
run (the module is complete in ``sys.modules``), and then stands aside. What the callback raises
propagates from the script's ``import`` statement (a BaseException passes a script's
``except Exception``), and again from every later import of the module in the block, in any
thread (a thread's failed import leaves no half-imported module for the main thread to meet).

Example:
    >>> with when_imported("paddle", lambda module: print("paddle is here")):  # doctest: +SKIP
    ...     runpy.run_path("train.py")
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Iterator, Optional


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callback."""

    def __init__(self, loader: Any, done: Callable[[ModuleType], None]) -> None:
        self._loader, self._done = loader, done

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # the module names its real loader, as without the watch
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._done(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback
        self.fired = False
        self.failure: Optional[BaseException] = None
        self._lock = threading.Lock()

    def fire(self, module: ModuleType) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        try:
            self.callback(module)
        except BaseException as exc:
            self.failure = exc  # every later import of the module, in any thread, fails the same way
            raise
        _remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == self.name and self.failure is not None:
            raise type(self.failure)(*self.failure.args)
        if fullname != self.name or self.fired:
            return None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self.fire)
                return spec
        return None


def _remove(finder: _Finder) -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def when_imported(name: str, callback: Callable[[ModuleType], None]) -> Iterator[None]:
    """Call ``callback(module)`` once, right after ``name`` is first imported in this block
    (at once when it was imported already); the watch ends with the block.

    Raises:
        Whatever ``callback`` raises: from the ``import`` statement that loaded ``name`` (and
        from every later import of it in the block), or from here when it was loaded already.
    """
    finder = _Finder(name, callback)
    if name in sys.modules:
        finder.fire(sys.modules[name])
        yield
        return
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        _remove(finder)
