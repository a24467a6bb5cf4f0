"""paddle-amp-ext: safe, visible mixed precision for PaddlePaddle.

A drop-in for ``paddle.amp``: ``import paddle_amp_ext as amp`` and use ``amp.auto_cast``,
``amp.GradScaler`` and ``amp.decorate`` as before; docs/differences.md lists what they add.
"""

from __future__ import annotations

import warnings as _warnings

__version__ = "0.1.0"

# Paddle 3.x warns about a missing C++ compiler cache on every import; it concerns only
# custom-op builds, so it is hidden here (narrowly, by its message).
_warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)

from .run import _deferred

if _deferred.starting_run():  # python -m paddle_amp_ext.run: the script imports paddle first (issue 30)
    __getattr__ = _deferred.deferred_getattr
elif _deferred.check_without_paddle():
    pass  # python -m paddle_amp_ext.check says itself that Paddle is missing (exit code 2, no traceback)
else:
    try:
        import paddle as _paddle  # noqa: F401
    except ImportError as _exc:  # pragma: no cover - exercised by a subprocess test
        raise ImportError(
            "paddle-amp-ext needs PaddlePaddle, which is not installed. " + _deferred.INSTALL_PADDLE
        ) from _exc

    from . import debugging
    from .autocast import auto_cast, decorate, is_bfloat16_supported, is_float16_supported
    from .backends import Accelerator
    from .config import AmpConfig
    from .device import probe
    from .errors import AmpOverflowError, AmpUnsupportedError
    from .events import StepEvent, StepResult
    from .fp8 import fp8_emulation, fp8_linears, fp8_readiness
    from .gate import AmpDecision, DeviceInfo, decide
    from .guard import OptimizerGuard, guard_optimizer
    from .integrations import hapi_amp_configs
    from .keep import keep_fp32
    from .legacy import AmpScaler, amp_decorate, amp_guard
    from .rehearsal import OverflowWatch, advise, find_overflow, fp16_emulation, rehearse
    from .run.routing import route, routed, unroute
    from .scaler import GradScaler

    _LAZY = {"VisualDLHook": "visualdl", "VisualDLCallback": "visualdl"}


    #: Names of the installed Paddle's ``paddle.amp.__all__`` that need no wrapping here (they read the
    #: AMP state that this package's ``auto_cast`` sets through Paddle's): served from ``paddle.amp``,
    #: so a name a future Paddle adds is importable from ``paddle_amp_ext`` too. Any other attribute of
    #: ``paddle.amp`` (``white_list``, ``amp_lists``, ``grad_scaler``, ...) is served the same way, so
    #: code that uses this package as its ``paddle.amp`` finds everything it had.
    _PADDLE_AMP = tuple(getattr(_paddle.amp, "__all__", ()))


    def __getattr__(name: str):  # PEP 562
        if name in _LAZY:  # VisualDL is imported only when a hook is asked for
            import importlib

            module = importlib.import_module(f".{_LAZY[name]}", __name__)
            return getattr(module, name)
        if name in _PADDLE_AMP or (not name.startswith("__") and hasattr(_paddle.amp, name)):
            return getattr(_paddle.amp, name)
        raise AttributeError(f"module 'paddle_amp_ext' has no attribute {name!r}")


    def __dir__() -> list:
        return sorted(set(globals()) | set(_LAZY) | set(_PADDLE_AMP))


    __all__ = [
        "Accelerator",
        "AmpConfig",
        "AmpScaler",
        "AmpDecision",
        "AmpOverflowError",
        "AmpUnsupportedError",
        "DeviceInfo",
        "GradScaler",
        "OptimizerGuard",
        "OverflowWatch",
        "StepEvent",
        "StepResult",
        "VisualDLCallback",
        "VisualDLHook",
        "__version__",
        "advise",
        "amp_decorate",
        "amp_guard",
        "auto_cast",
        "debugging",
        "decide",
        "decorate",
        "find_overflow",
        "fp16_emulation",
        "fp8_emulation",
        "fp8_linears",
        "fp8_readiness",
        "guard_optimizer",
        "hapi_amp_configs",
        "is_bfloat16_supported",
        "is_float16_supported",
        "keep_fp32",
        "probe",
        "rehearse",
        "route",
        "routed",
        "unroute",
        *(name for name in _PADDLE_AMP if name not in globals()),
    ]
