"""``auto_cast``, ``decorate`` and ``keep_fp32``: Paddle's names, validated lists, one decision.

Example:
    >>> import paddle_amp_ext as amp
    >>> with amp.auto_cast(dtype="auto", custom_black_list=["gelu"]):  # doctest: +SKIP
    ...     loss = model(x).mean()
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterable, Iterator, Optional, Tuple

import paddle

from . import _compat, _state, oplists
from ._log import info_once, logger, warn_once
from .config import DTYPES, AmpConfig, as_op_names
from .device import current_decision, device_decision
from .keep import is_kept_fp32, keep_fp32

_AUTO_CAST_DEFAULTS = dict(
    enable=True, custom_white_list=None, custom_black_list=None, level="O1", dtype="float16"
)


def _from_config(config: AmpConfig | None, given: dict[str, Any]) -> dict[str, Any]:
    if config is None:
        return given
    if not isinstance(config, AmpConfig):
        raise TypeError(f"config must be an AmpConfig. Received: {config!r} (of type {type(config).__name__})")
    changed = [k for k, v in given.items() if k in _AUTO_CAST_DEFAULTS and v != _AUTO_CAST_DEFAULTS[k]]
    if changed:
        raise TypeError(
            f"Pass either config= or {changed}, not both: put them in the AmpConfig "
            "(config.replace(...))."
        )
    return dict(
        enable=config.enable,
        custom_white_list=config.custom_white_list,
        custom_black_list=config.custom_black_list,
        level=config.level,
        dtype=config.dtype,
    )


def _normalize_dtype(dtype: Any) -> str:
    if hasattr(dtype, "name") and not isinstance(dtype, str):  # paddle DataType
        dtype = dtype.name
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}. Received: dtype={dtype!r}")
    return dtype.lower()


def _flag(name: str, value: Any) -> bool:
    """A bool argument: True/False (or numpy bools, 0 and 1); a str such as "false" is an error."""
    if isinstance(value, bool) or (hasattr(value, "dtype") and str(getattr(value, "dtype", "")) == "bool"):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False. Received: {name}={value!r} (of type {type(value).__name__})")


def resolve_precision(enable: bool, dtype: str, *, strict: bool = False) -> tuple[bool, str]:
    """Where AMP can run now: (enable, dtype) after the gate, for auto_cast and decorate.

    Static programs (``paddle.enable_static()``, ``paddle.jit.to_static`` conversion) are
    Paddle's to judge: an explicit dtype is passed on as asked (Paddle 3.x enables AMP in a PIR
    program with no device check; 2.6 rejects ``auto_cast`` there), ``"auto"`` asks the gate.
    """
    if not enable:
        return False, "float16" if dtype == "auto" else dtype
    static = _compat.in_static_mode()
    emulated = _state.emulated_dtype()
    if emulated is not None and not static:
        return False, emulated  # the emulation quantizes; Paddle's CPU kernels stay fp32
    if static and dtype != "auto":
        return True, dtype
    kind = _compat.place_kind()
    if kind in ("xpu", "custom"):
        decision = device_decision(kind, dtype, strict)
    elif kind == "gpu" or dtype == "auto":
        decision = current_decision(dtype, strict)
    else:  # an explicit dtype on the CPU
        if strict:
            current_decision(dtype, strict)  # raises AmpUnsupportedError with the reason
        warn_once(
            "autocast:cpu",
            "auto_cast(dtype=%r) runs in float32: Paddle's CPU build has no float16/bfloat16 "
            "kernels for matmul, conv2d or softmax. Use paddle_amp_ext.fp16_emulation(model) "
            "to rehearse low-precision numerics on a CPU.",
            dtype,
        )
        return False, dtype
    if not decision.enabled:  # explicit requests were warned about by the gate
        if dtype == "auto":
            warn_once(f"autocast:auto:{decision.reason}", "auto_cast(dtype='auto'): %s", decision.reason)
        return False, "float16" if dtype == "auto" else dtype
    return True, decision.dtype


@contextlib.contextmanager
def _auto_cast(
    enable: bool, white: Any, black: Any, level: str, dtype: str, use_promote: bool, strict: bool
) -> Iterator[None]:
    level = str(level).upper()
    dtype = _normalize_dtype(dtype)
    requested = enable
    enable, run_dtype = resolve_precision(enable, dtype, strict=strict)
    if requested and not (white or black) and _in_rehearsal_as_is(level, use_promote):
        yield  # the rehearsal's own lists and level stay in force; Paddle's guard is not entered
        return
    resolved = oplists.resolve(white, black, run_dtype, level)
    for note in resolved.mapped:
        info_once(f"oplists:{note}", "%s", note)
    for note in resolved.no_effect:
        warn_once(f"oplists:{note}", "%s", note)
    for note in resolved.elsewhere:
        info_once(f"oplists:{note}", "%s", note)
    with _compat.paddle_auto_cast(
        enable=enable,
        custom_white_list=sorted(resolved.white) or None,
        custom_black_list=sorted(resolved.black) or None,
        level=level,
        dtype=run_dtype,
        use_promote=use_promote,
    ):
        if _state.emulated_dtype() is None or _compat.in_static_mode():
            yield
            return
        if requested and not (white or black):
            if _state.rehearsal_level() == (level, use_promote):
                yield  # as in _in_rehearsal_as_is, entered for Paddle's master-gradient hook
                return
            lists = _lists_at(run_dtype, level, *_state.rehearsal_custom_lists())  # its lists at this level
        else:
            lists = _compat.tracer_op_lists()  # Paddle installed them, enable=False or not
        # the op-level rehearsal follows them
        token = _state.push_autocast(bool(requested), _state.Lists(*lists, level, bool(use_promote)))
        try:
            yield
        finally:
            _state.pop_autocast(token)


def auto_cast(
    enable: bool = True,
    custom_white_list: Iterable[str] | None = None,
    custom_black_list: Iterable[str] | None = None,
    level: str = "O1",
    dtype: str = "float16",
    use_promote: bool = True,
    *,
    config: AmpConfig | None = None,
    strict: bool = False,
) -> contextlib.AbstractContextManager:
    """``paddle.amp.auto_cast`` with validated op lists and the compute-capability gate.

    Args:
        enable: turn AMP on (as in Paddle; a bool: a string such as ``"false"`` is a ``TypeError``).
        custom_white_list: op names to run in low precision, API names accepted (``matmul`` is
            looked up as ``matmul_v2``); validated against the installed Paddle's op registry.
        custom_black_list: op names to keep in float32, validated the same way.
        level: ``"O1"`` (cast by the op lists), ``"O2"`` (all but the black list), ``"OD"`` or
            ``"O0"``, as in Paddle.
        dtype: ``"float16"``, ``"bfloat16"`` or ``"auto"`` (bfloat16 on CC >= 8.0, float16 on
            7.x, float32 elsewhere, with the reason logged once).
        use_promote: as in Paddle: an op with a float32 input runs in float32 at O2.
        config: an :class:`AmpConfig` supplying enable, lists, level and dtype.
        strict: raise ``AmpUnsupportedError`` instead of falling back to float32.

    Returns:
        A context manager; inside it, eager ops run in the precision chosen. Entering it costs no
        device-to-host sync.

    Raises:
        ValueError: an unknown op name (with the closest real names), an op in both lists, or a
            ``level`` Paddle does not know (checked here, at the call).
        TypeError: a list that is not an iterable of str, a ``level`` that is not a str, or an
            ``enable`` that is not a bool.
        AmpUnsupportedError: with ``strict=True``, when the requested dtype cannot run here.

    Example:
        >>> with auto_cast(custom_white_list=["matmul"]):  # doctest: +SKIP
        ...     out = model(x)
    """
    args = _from_config(
        config,
        dict(
            enable=enable,
            custom_white_list=custom_white_list,
            custom_black_list=custom_black_list,
            level=level,
            dtype=dtype,
        ),
    )
    args["enable"] = _flag("enable", args["enable"])
    _check_cast_level(args["level"])
    # materialize once and validate now, so a typo fails at the call site
    white = as_op_names("custom_white_list", args["custom_white_list"])
    black = as_op_names("custom_black_list", args["custom_black_list"])
    oplists.validate(white, black)
    return _auto_cast(
        args["enable"],
        white,
        black,
        args["level"],
        args["dtype"],
        use_promote,
        strict,
    )


def _in_rehearsal_as_is(level: str, use_promote: bool) -> bool:
    """Whether an ``auto_cast`` without custom lists changes nothing here: a dygraph rehearsal at
    this level is active (its own lists go on deciding), and Paddle's guard, which the rehearsal
    always enters disabled, would only record its arguments (``amp_state()``) and install op lists
    the tracer ignores at O0 (the tracer's level stays O0, its dtype float32, as in every
    rehearsal). Paddle's guard is entered where it would register a master-gradient hook
    (``decorate(master_grad=True)``). Skipping it saves 0.1-0.15 ms of cold Python per step."""
    return (_state.emulated_dtype() is not None and not _compat.in_static_mode()
            and _state.rehearsal_level() == (level, use_promote) and not _compat.master_grad_hook_due())


@functools.lru_cache(maxsize=32)
def _lists_at(dtype: str, level: str, white: Tuple[str, ...], black: Tuple[str, ...]) -> Tuple[frozenset, frozenset]:
    """A rehearsal's custom lists at another level (an ``auto_cast(level="O2")`` inside an O1
    rehearsal), computed once."""
    return effective_op_lists(dtype, level, None, white, black)


def effective_op_lists(dtype: str, level: str = "O1", config: Optional[AmpConfig] = None,
                       custom_white_list: Any = None, custom_black_list: Any = None
                       ) -> Tuple[frozenset, frozenset]:
    """The (white, black) lists Paddle's tracer holds inside ``auto_cast`` with these settings."""
    if config is not None:
        level, custom_white_list, custom_black_list = (
            config.level, config.custom_white_list, config.custom_black_list)
    # enable=False: Paddle still installs the lists in the tracer, and nothing is cast or warned
    with auto_cast(enable=False, custom_white_list=custom_white_list, custom_black_list=custom_black_list,
                   level=level, dtype=dtype):
        return _compat.tracer_op_lists()


# --------------------------------------------------------------------------- decorate
def decorate(
    models: Any,
    optimizers: Any = None,
    level: str = "O1",
    dtype: str = "float16",
    master_weight: bool | None = None,
    save_dtype: str | None = None,
    master_grad: bool = False,
    excluded_layers: Any = None,
    *,
    config: AmpConfig | None = None,
) -> Any:
    """``paddle.amp.decorate`` that honours keep-fp32 layers, ``config`` and the gate.

    Layers marked by :func:`keep_fp32` or named in ``config.fp32_layers`` join
    ``excluded_layers`` in O2. Where the gate says float32 (no GPU, CC < 7.0, or under
    fp16 emulation) the models are returned unconverted, with the reason logged once.

    Args:
        models: a ``paddle.nn.Layer`` or a list of them.
        optimizers: an optimizer or a list of them, or None.
        level: ``"O1"`` (parameters left as they are) or ``"O2"`` (cast to low precision).
        dtype: ``"float16"``, ``"bfloat16"`` or ``"auto"`` (the gate's choice).
        master_weight: keep float32 master weights in the optimizers at O2 (Paddle's default: yes).
        save_dtype: the dtype ``paddle.save`` writes the parameters in; checked here on every
            device (Paddle checks it only where AMP runs).
        master_grad: keep float32 master gradients at O2, as in Paddle.
        excluded_layers: layers (or layer types) left in float32 at O2, as in Paddle.
        config: an :class:`AmpConfig` supplying level, dtype and ``fp32_layers``.

    Returns:
        ``models`` when ``optimizers`` is None, else ``(models, optimizers)``, converted where AMP
        runs and unconverted elsewhere.

    Raises:
        ValueError: a ``level``, ``dtype`` or ``save_dtype`` Paddle does not accept, or an
            ``fp32_layers`` name that matches no sublayer.
    """
    enable = True
    if config is not None:
        args = _from_config(config, dict(level=level, dtype=dtype))
        level, dtype, enable = args["level"], args["dtype"], args["enable"]
    _check_decorate_args(level, dtype, save_dtype)
    model_list = models if isinstance(models, (list, tuple)) else [models]
    if config is not None and config.fp32_layers:
        for model in model_list:
            keep_fp32(model, config.fp32_layers)
    enable, run_dtype = resolve_precision(enable, dtype)
    marked = [s for m in model_list for _, s in m.named_sublayers(include_self=True) if is_kept_fp32(s)]
    if excluded_layers is None:
        excluded = marked or None
    else:
        given = list(excluded_layers) if isinstance(excluded_layers, (list, tuple)) else [excluded_layers]
        excluded = given + marked
    if not enable:
        if level == "O2" and not _compat.in_static_mode():  # a rehearsal holds them in low precision
            _state.mark_o2(_compat.o2_low_precision_layers(model_list, run_dtype, excluded), run_dtype,
                           master_weight is not False)
        if level == "O2" and _state.emulated_dtype() is None:
            warn_once("decorate:fp32", "decorate(level='O2') leaves parameters in float32: AMP cannot run here.")
        return models if optimizers is None else (models, optimizers)
    logger.debug("decorate: level=%s dtype=%s excluded=%d layers", level, run_dtype, len(excluded or ()))
    return _compat.paddle_decorate(
        models,
        optimizers,
        level=level,
        dtype=run_dtype,
        master_weight=master_weight,
        save_dtype=save_dtype,
        master_grad=master_grad,
        excluded_layers=excluded,
    )


#: The levels ``paddle.amp.auto_cast`` accepts (either case), on 2.6 and 3.x alike.
CAST_LEVELS = ("O0", "OD", "O1", "O2")


def _check_cast_level(level: Any) -> None:
    """``auto_cast``'s ``level`` as Paddle would check it at ``with``, but at the call and naming the value."""
    if not isinstance(level, str):
        raise TypeError(f"auto_cast level must be a str, one of {CAST_LEVELS}. Received: level={level!r} "
                        f"(of type {type(level).__name__})")
    if level.upper() not in CAST_LEVELS:
        raise ValueError(f"auto_cast level must be one of {CAST_LEVELS} (as in paddle.amp.auto_cast: 'O1' casts by the "
                         f"op lists, 'O2' casts all but the black list, 'OD' only the default white list, 'O0' "
                         f"nothing). Received: level={level!r}")


def _check_decorate_args(level: Any, dtype: Any, save_dtype: Any) -> None:
    """Paddle's own checks of ``decorate``, made everywhere (Paddle skips none of them on a CPU
    for level and dtype; ``save_dtype`` it checks only where AMP runs)."""
    if level not in ("O1", "O2"):
        raise ValueError(f"decorate level must be 'O1' or 'O2' (as in paddle.amp.decorate; 'O1' leaves parameters "
                         f"as they are, 'O2' casts them to low precision). Received: level={level!r}")
    if dtype not in ("float16", "bfloat16", "auto"):
        raise ValueError(f"decorate dtype must be 'float16', 'bfloat16' or 'auto'. Received: dtype={dtype!r}")
    if save_dtype is not None and save_dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise ValueError("save_dtype must be None, 'float16', 'bfloat16', 'float32' or 'float64'. "
                         f"Received: save_dtype={save_dtype!r}")


def is_float16_supported(device: str | None = None) -> bool:
    """``paddle.amp.is_float16_supported``; see :func:`paddle_amp_ext.decide` for whether it pays.

    Args:
        device: a Paddle device string such as ``"gpu:0"``; None for the current device.

    Returns:
        Whether the device has float16 kernels (Paddle's answer).
    """
    return bool(paddle.amp.is_float16_supported(device))


def is_bfloat16_supported(device: str | None = None) -> bool:
    """``paddle.amp.is_bfloat16_supported``.

    Args:
        device: a Paddle device string such as ``"gpu:0"``; None for the current device.

    Returns:
        Whether the device has bfloat16 kernels (Paddle's answer).
    """
    return bool(paddle.amp.is_bfloat16_supported(device))
