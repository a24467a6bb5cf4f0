"""The dygraph tracer, static/PIR mode, Paddle's default op lists and its global AMP state.

Relies on (checked against paddlepaddle 2.6.2 and 3.3.1):

- ``paddle.base.framework._dygraph_tracer()``: its ``_expected_place`` (which device AMP would run
  on), ``_get_amp_op_list()`` (the white/black op lists in force inside ``auto_cast``) and
  ``_amp_level``. There is no tracer in static mode (``paddle.enable_static()`` and code being
  converted by ``paddle.jit.to_static``).
- ``paddle.base.framework.in_pir_mode()``: 3.x static graphs are PIR programs, where
  ``paddle.amp.auto_cast`` works (it sets the program's AMP attributes, with no device check);
  2.6's legacy static graph rejects ``auto_cast`` (an AssertionError from ``amp_guard``).
- ``paddle.amp.auto_cast._is_gpu_float16_supported`` / ``_is_gpu_bfloat16_supported``: the rule
  ``amp_guard`` applies on a GPU (on 3.x, ROCm builds allow both).
- ``paddle.amp.amp_lists``: Paddle's default white/black lists (the op registry and Paddle's op
  definitions are read in :mod:`.opdefs`).
- the modules ``paddle.amp.auto_cast`` and ``paddle.amp.grad_scaler``: Paddle's own ``auto_cast``,
  ``decorate`` and ``GradScaler``, reached through their modules so that routing ``paddle.amp``
  to this package (:mod:`paddle_amp_ext.run.routing`) never makes them call themselves.
- ``to_static``'s SOT translator, two ways: while it simulates Python code to build a graph,
  it replaces a call of ``paddle.jit.sot.psdb.in_sot`` (False when really called) by True; while
  a converted function runs for real, its frame evaluation callback is installed
  (``paddle.framework.core.set_eval_frame(None)`` returns it; it is put back at once) and it
  translates every Python frame called from there, except those of files under the prefixes of
  ``paddle.jit.sot.opcode_translator.skip_files.skip_file_names`` (Paddle's own among them),
  which ``paddle.framework.core.eval_frame_skip_file_prefix`` installs.
- ``paddle.amp.auto_cast.amp_global_state().amp_dtype``: Paddle's scaler disables itself in
  ``scale()`` unless this is ``'float16'``; fp16 emulation sets it. ``amp_state()``: the
  arguments of the innermost ``auto_cast``. ``use_master_grad`` and
  ``already_register_final_backward_hook``: whether ``amp_guard`` registers its master-gradient
  hook when entered (enabled or not).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import paddle


def _parse_version(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


PADDLE_VERSION: tuple[int, int, int] = _parse_version(paddle.__version__)


def _auto_cast_module() -> Any:
    """The module ``paddle.amp.auto_cast`` (on 2.6 the attribute of that name is the function)."""
    import importlib

    return importlib.import_module("paddle.amp.auto_cast")


def paddle_auto_cast(*args: Any, **kwargs: Any) -> Any:
    """Paddle's own ``auto_cast``, also while ``paddle.amp`` is routed to this package."""
    return _auto_cast_module().auto_cast(*args, **kwargs)


def paddle_decorate(*args: Any, **kwargs: Any) -> Any:
    """Paddle's own ``decorate``, also while ``paddle.amp`` is routed to this package."""
    return _auto_cast_module().decorate(*args, **kwargs)


def _tracer() -> Any:
    from paddle.base.framework import _dygraph_tracer

    return _dygraph_tracer()


# --------------------------------------------------------------------------- modes
def in_static_mode() -> bool:
    """True while building a static program (``enable_static`` or ``to_static`` conversion)."""
    return not paddle.in_dynamic_mode()


def _not_simulated() -> bool:
    return False


_in_sot = _not_simulated  # psdb.in_sot after watch_for_sot(); a global, so SOT sees the call


def watch_for_sot() -> None:
    """Make SOT leave this package's frames alone (run them as it runs Paddle's own files) and let
    :func:`runs_eagerly` see its simulation. Imports SOT (~70 ms, once)."""
    global _in_sot
    from paddle.jit.sot import psdb
    from paddle.jit.sot.opcode_translator import skip_files

    _in_sot = psdb.in_sot
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    if package not in skip_files.skip_file_names:
        skip_files.skip_file_names.add(package)
        paddle.framework.core.eval_frame_skip_file_prefix(tuple(skip_files.skip_file_names))


def _sot_callback_installed() -> bool:
    set_eval_frame = paddle.framework.core.set_eval_frame
    callback = set_eval_frame(None)
    set_eval_frame(callback)
    return callback is not None


def runs_eagerly() -> bool:
    """True when ops run now on real tensors, in plain dygraph: not in a static program, not in
    code being converted by ``to_static`` (AST, or SOT once :func:`watch_for_sot` ran)."""
    return paddle.in_dynamic_mode() and not _in_sot() and not _sot_callback_installed()


def _in_pir_mode() -> bool:
    from paddle.base import framework

    check = getattr(framework, "in_pir_mode", None)
    return bool(check()) if check is not None else False


def static_amp_supported() -> bool:
    """Whether ``paddle.amp.auto_cast`` can be entered now: dygraph, or a 3.x PIR program."""
    return paddle.in_dynamic_mode() or _in_pir_mode()


@functools.cache
def _static_kinds() -> tuple:
    pir = getattr(paddle, "pir", None)
    return tuple(t for t in (getattr(pir, "Value", None), getattr(paddle.static, "Variable", None)) if t)


def is_static_value(value: Any) -> bool:
    """A static-graph value (3.x ``pir.Value`` or a legacy ``static.Variable``), not a Tensor.

    Called by ``GradScaler.scale()`` at every step: the types are looked up once.
    """
    return not isinstance(value, paddle.Tensor) and isinstance(value, _static_kinds())


# --------------------------------------------------------------------------- tracer and place
def place_kind() -> str:
    """Where eager ops run now: ``'gpu'``, ``'xpu'``, ``'custom'`` or ``'cpu'`` (also in static mode)."""
    tracer = _tracer()
    place = tracer._expected_place if tracer is not None else paddle.framework._current_expected_place()
    if place.is_gpu_place():
        return "gpu"
    if place.is_xpu_place():
        return "xpu"
    if place.is_custom_place():
        return "custom"
    return "cpu"


def place_device() -> tuple[int, str]:
    """The expected place's device id and, on a custom place, its device type (``""`` otherwise),
    read as ``auto_cast.py`` reads them (``_current_expected_place().get_device_id()``,
    ``.get_device_type()``; 2.6.2 and 3.3.1)."""
    place = paddle.framework._current_expected_place()
    if place.is_custom_place():
        return int(place.get_device_id()), str(place.get_device_type())
    if place.is_xpu_place() or place.is_gpu_place():
        return int(place.get_device_id()), ""
    return 0, ""


def xpu_generation(device_id: int) -> int:
    """The Kunlun generation (1, 2, 3) of XPU ``device_id``: ``core.get_xpu_device_version`` as an
    ``XPUVersion``, which 3.3.1's ``_is_xpu_float16_supported`` compares (XPU builds only)."""
    from paddle.base import core

    return int(core.get_xpu_device_version(device_id))


def tracer_op_lists() -> tuple[frozenset[str], frozenset[str]]:
    """The (white, black) op lists in force in the tracer right now."""
    white, black = _tracer()._get_amp_op_list()
    return frozenset(white), frozenset(black)


def tracer_amp_level() -> str:
    """The tracer's AMP level as ``'O0'``, ``'O1'``, ``'O2'`` or ``'OD'``."""
    return str(_tracer()._amp_level).rsplit(".", 1)[-1]


# --------------------------------------------------------------------------- op lists
def default_op_lists(dtype: str, level: str) -> tuple[frozenset[str], frozenset[str]]:
    """Paddle's own (white, black) lists for ``dtype`` and ``level``."""
    from paddle.amp import amp_lists

    return (
        frozenset(amp_lists.white_list()[dtype][level]),
        frozenset(amp_lists.black_list()[dtype][level]),
    )


# --------------------------------------------------------------------------- AMP global state
def amp_state_dtype() -> str:
    """The dtype Paddle's scaler checks in ``scale()`` (``'float32'`` before any auto_cast)."""
    from paddle.amp.auto_cast import amp_global_state

    return str(amp_global_state().amp_dtype)


def set_amp_state_dtype(dtype: str) -> str:
    """Set Paddle's global AMP dtype; return the previous value."""
    from paddle.amp.auto_cast import amp_global_state

    state = amp_global_state()
    previous = str(state.amp_dtype)
    state.amp_dtype = dtype
    return previous


def master_grad_hook_due() -> bool:
    """Whether Paddle's ``auto_cast`` would register its master-gradient hook when entered (after
    ``decorate(master_grad=True)``, once per backward), enabled or not."""
    from paddle.amp.auto_cast import amp_global_state

    state = amp_global_state()
    return bool(getattr(state, "use_master_grad", False)
                and not getattr(state, "already_register_final_backward_hook", False))


def autocast_enabled() -> bool:
    """Whether the innermost ``paddle.amp.auto_cast`` context asked for AMP (False outside)."""
    state = _auto_cast_module().amp_state()
    return bool(state and state.get("enable", False))
