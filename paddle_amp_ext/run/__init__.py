"""Routing ``paddle.amp`` to this package, and ``python -m paddle_amp_ext.run``, which routes a whole script.

- :mod:`.routing` (public): :func:`route`, :func:`routed`, :func:`unroute`,
  :func:`active_routing`, :class:`Routing`: ``paddle.amp``'s ``GradScaler``, ``auto_cast`` and
  ``decorate`` become this package's, reversibly, for code you do not own.
- ``python -m paddle_amp_ext.run [options] SCRIPT [ARGS...]`` (or ``-m MODULE``; the command line
  is :mod:`paddle_amp_ext.cli.run`): an unmodified script runs as ``python SCRIPT`` would, routed.

Private plumbing: ``_overrides`` (how a routing's config applies to the calls), ``_autoguard``
(optimizers guarded while routed), ``_importwatch`` (a callback at a module's first import),
``_deferred`` (the package waits for the script's own ``import paddle``), ``_scripting`` (a script
started as ``python`` starts it; ``doctor`` shares it), ``_session`` (what ``run`` attaches) and
``_watch`` (the script's children, threads and stdout).

This package's ``__init__`` imports nothing of Paddle's: ``run`` starts before the script imports
paddle. The public names resolve on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, List

__all__: List[str] = ["Routing", "active_routing", "route", "routed", "unroute"]


def __getattr__(name: str) -> Any:  # PEP 562: .routing imports paddle, only when asked for
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.routing"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
