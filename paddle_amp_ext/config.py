"""``AmpConfig``: every AMP setting in one frozen, validated value.

Example:
    >>> cfg = AmpConfig(dtype="auto", custom_black_list=["gelu"], init_loss_scaling=2**14)
    >>> AmpConfig.from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, FrozenSet, Iterable, Mapping, Optional, Tuple

from . import configfile, oplists

#: The largest float32: the default upper bound of the loss scale (Paddle's scale is a float32
#: tensor, unbounded below that).
FLOAT32_MAX = 3.4028234663852886e38
DTYPES = ("float16", "bfloat16", "auto")
LEVELS = ("O1", "O2")
HYSTERESIS = ("consecutive", "cumulative")
ON_COLLAPSE = ("warn", "raise")


def _describe(value: object) -> str:
    return f"{value!r} (of type {type(value).__name__})"


def as_op_names(list_name: str, value: object) -> tuple[str, ...]:
    """``value`` (None or an iterable of str) as a tuple; TypeError naming ``list_name`` otherwise."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{list_name} must be an iterable of op names such as ['softmax']. "
            f"Received: {list_name}={_describe(value)}"
        )
    items = tuple(value)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(
                f"{list_name} must contain only str op names. Received an item {_describe(item)}"
            )
    return items


def _choice(name: str, value: object, choices: tuple[str, ...], normalize=str.lower) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}. Received: {name}={_describe(value)}")
    normalized = normalize(value)
    if normalized not in choices:
        hint = difflib.get_close_matches(normalized, choices, n=1)
        suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(
            f"{name} must be one of {choices}. Received: {name}={_describe(value)}.{suggestion}"
        )
    return normalized


def _number(name: str, value: object, *, integer: bool = False) -> float:
    """A real number (Python or numpy scalar, not a bool), finite; an int where ``integer``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy bools are not Real
        kind = "an int" if integer else "a number"
        raise TypeError(f"{name} must be {kind}. Received: {name}={_describe(value)}")
    try:
        as_float = float(value)
    except OverflowError:  # an int beyond float's range
        as_float = math.inf
    if not math.isfinite(as_float):
        raise ValueError(f"{name} must be finite. Received: {name}={value!r}")
    if integer and not as_float.is_integer():
        raise TypeError(f"{name} must be an int. Received: {name}={_describe(value)}")
    return int(value) if integer else as_float


@dataclass(frozen=True)
class AmpConfig:
    """AMP settings for ``auto_cast``, ``decorate`` and ``GradScaler``, validated once.

    Args:
        enable: Turn AMP on. With ``dtype="auto"`` the compute-capability gate still decides.
        dtype: ``"float16"``, ``"bfloat16"`` or ``"auto"`` (the best the GPU supports).
        level: ``"O1"`` (per-op lists) or ``"O2"`` (pure low precision but the black list).
        custom_white_list: Op names to run in low precision; validated against the ops Paddle defines
            for any backend (a GPU-only op such as ``sync_batch_norm`` is valid on a CPU).
        custom_black_list: Op names to keep in float32.
        fp32_layers: Sublayer names (``"head"``, ``"encoder.norm"``) or layer class names
            (``"LayerNorm"``) to keep in float32 (see :func:`paddle_amp_ext.keep_fp32`).
        init_loss_scaling: The first loss scale, as in ``paddle.amp.GradScaler`` (default 2**16).
        incr_ratio: The factor the scale grows by, as in ``paddle.amp.GradScaler``.
        decr_ratio: The factor the scale shrinks by after an overflow, as in ``paddle.amp.GradScaler``.
        incr_every_n_steps: Finite steps in a row before the scale grows, as in ``paddle.amp.GradScaler``.
        decr_every_n_nan_or_inf: Overflowing steps before the scale shrinks, as in ``paddle.amp.GradScaler``.
        use_dynamic_loss_scaling: Change the scale at all, as in ``paddle.amp.GradScaler``.
        min_loss_scaling: The lower bound of the dynamic loss scale (default 1.0).
        max_loss_scaling: The upper bound of the dynamic loss scale (default float32's largest value).
        hysteresis: ``"consecutive"`` (Paddle's rule: a finite step resets the inf counter) or
            ``"cumulative"`` (inf steps count until the scale changes).
        max_consecutive_skips: After this many skipped steps in a row, ``on_collapse`` applies.
        on_collapse: ``"warn"`` or ``"raise"`` (``AmpOverflowError``).
        fp8_exclude_layers: ``nn.Linear`` sublayer names to keep out of FP8 under
            :func:`paddle_amp_ext.fp8_linears` (the FP8 advisor writes them, see docs/fp8.md).

    Raises:
        TypeError: a value of the wrong type, naming it and the fix.
        ValueError: a value out of range, an unknown op name or choice, naming it and the fix.
    """

    enable: bool = True
    dtype: str = "float16"
    level: str = "O1"
    custom_white_list: Tuple[str, ...] = ()
    custom_black_list: Tuple[str, ...] = ()
    fp32_layers: Tuple[str, ...] = ()
    init_loss_scaling: float = 65536.0
    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 2000
    decr_every_n_nan_or_inf: int = 1
    use_dynamic_loss_scaling: bool = True
    min_loss_scaling: float = 1.0
    max_loss_scaling: float = FLOAT32_MAX
    hysteresis: str = "consecutive"
    max_consecutive_skips: Optional[int] = None
    on_collapse: str = "warn"
    fp8_exclude_layers: Tuple[str, ...] = ()
    _given: FrozenSet[str] = dataclasses.field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        for flag in ("enable", "use_dynamic_loss_scaling"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(
                    f"{flag} must be True or False. Received: {flag}={_describe(getattr(self, flag))}"
                )
        put(self, "dtype", _choice("dtype", self.dtype, DTYPES))
        put(self, "level", _choice("level", self.level, LEVELS, normalize=str.upper))
        put(self, "hysteresis", _choice("hysteresis", self.hysteresis, HYSTERESIS))
        put(self, "on_collapse", _choice("on_collapse", self.on_collapse, ON_COLLAPSE))
        white = as_op_names("custom_white_list", self.custom_white_list)
        black = as_op_names("custom_black_list", self.custom_black_list)
        put(self, "custom_white_list", white)
        put(self, "custom_black_list", black)
        put(self, "fp32_layers", as_op_names("fp32_layers", self.fp32_layers))
        if "" in self.fp32_layers:
            raise ValueError(f"fp32_layers={list(self.fp32_layers)} contains '', the model's own name: it would "
                             "keep the whole model in float32, which is no AMP at all. Name sublayers by path "
                             "('head', 'encoder.norm') or class ('LayerNorm'); for a float32 model, turn AMP off "
                             "(enable=False).")
        put(self, "fp8_exclude_layers", as_op_names("fp8_exclude_layers", self.fp8_exclude_layers))
        if "" in self.fp8_exclude_layers:
            raise ValueError(f"fp8_exclude_layers={list(self.fp8_exclude_layers)} contains ''; name the nn.Linear "
                             "sublayers by their path ('0', 'mlp.down_proj'), as model.named_sublayers() does")
        oplists.validate(white, black)
        validate_scaling(
            init_loss_scaling=self.init_loss_scaling,
            incr_ratio=self.incr_ratio,
            decr_ratio=self.decr_ratio,
            incr_every_n_steps=self.incr_every_n_steps,
            decr_every_n_nan_or_inf=self.decr_every_n_nan_or_inf,
            min_loss_scaling=self.min_loss_scaling,
            max_loss_scaling=self.max_loss_scaling,
            max_consecutive_skips=self.max_consecutive_skips,
        )
        for name in ("init_loss_scaling", "incr_ratio", "decr_ratio", "min_loss_scaling", "max_loss_scaling"):
            put(self, name, float(getattr(self, name)))  # numpy scalars become plain floats
        for name in ("incr_every_n_steps", "decr_every_n_nan_or_inf", "max_consecutive_skips"):
            if getattr(self, name) is not None:
                put(self, name, int(getattr(self, name)))
        put(self, "_given", frozenset(f.name for f in _settings() if getattr(self, f.name) != f.default))

    @property
    def given(self) -> FrozenSet[str]:
        """The keys this config sets, which routing applies over a caller's arguments.

        Read by :meth:`from_dict` or :meth:`from_file`: the keys the mapping or file has; changed
        by :meth:`replace`: those keys too; built in code: the keys whose value is not the default.
        """
        return self._given

    # ------------------------------------------------------------------ conversions
    def to_dict(self) -> dict[str, Any]:
        """A plain dict of every setting; ``from_dict`` of it gives an equal config.

        Returns:
            ``{setting: value}``, op names as lists.
        """
        out: dict[str, Any] = {}
        for f in _settings():
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AmpConfig:
        """Build from a mapping of settings; the keys it holds become :attr:`given`.

        Args:
            data: ``{setting: value}``, e.g. from ``to_dict()`` or a parsed TOML/JSON file.

        Returns:
            The validated config.

        Raises:
            TypeError: ``data`` is not a mapping, or a value has the wrong type.
            ValueError: an unknown key (with the closest real key) or a bad value.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"AmpConfig.from_dict expects a mapping. Received: {_describe(data)}")
        known = [f.name for f in _settings()]
        for key in data:
            if key not in known:
                hint = difflib.get_close_matches(str(key), known, n=1)
                suggestion = f" Did you mean {hint[0]!r}?" if hint else f" Known keys: {known}."
                raise ValueError(f"Unknown AmpConfig key {key!r}.{suggestion}")
        config = cls(**dict(data))
        object.__setattr__(config, "_given", frozenset(data))
        return config

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict`, which ``from_file`` reads back as an equal config.

        Returns:
            The JSON document, indented, with a final newline.
        """
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def to_toml(self, keys: Optional[Iterable[str]] = None) -> str:
        """TOML text with the settings at top level (``None`` values are left out).

        Args:
            keys: only these settings (``config.given``: the ones the config sets), else all.

        Returns:
            The TOML document, one ``key = value`` line per setting.
        """
        only = None if keys is None else set(keys)
        lines = []
        for key, value in self.to_dict().items():
            if value is None or (only is not None and key not in only):
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_file(cls, path: str | Path) -> AmpConfig:
        """Read a ``.toml`` or ``.json`` file (settings at top level or under ``[amp]``).

        The file is checked before it is read: a device (``/dev/zero``), a named pipe or a
        directory, or a file over 1 MiB (``configfile.MAX_BYTES``), is refused.

        Args:
            path: a ``.toml`` or ``.json`` file.

        Returns:
            The validated config; :attr:`given` holds the keys the file sets.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a regular file or too large (named with its size and the limit),
                unparsable text, an unknown suffix, key or value (the message names the file).
        """
        path = Path(path)
        data = configfile.parse(path)
        try:
            return cls.from_dict(configfile.settings_table(data))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"Config file {str(path)!r}: {exc}") from None

    # ------------------------------------------------------------------ derived values
    def replace(self, **changes: Any) -> AmpConfig:
        """A copy with ``changes`` applied (validated); its :attr:`given` adds the changed keys.

        Args:
            **changes: settings and their new values.

        Returns:
            The new config (this one is frozen and unchanged).

        Raises:
            TypeError: an unknown setting or a value of the wrong type.
            ValueError: a value out of range.
        """
        config = dataclasses.replace(self, **changes)
        object.__setattr__(config, "_given", self._given | config._given | frozenset(changes))
        return config


def _settings() -> Tuple[dataclasses.Field, ...]:
    """AmpConfig's settings (its public fields)."""
    return tuple(f for f in dataclasses.fields(AmpConfig) if not f.name.startswith("_"))


def validate_scaling(
    *,
    init_loss_scaling: object,
    incr_ratio: object,
    decr_ratio: object,
    incr_every_n_steps: object,
    decr_every_n_nan_or_inf: object,
    min_loss_scaling: object,
    max_loss_scaling: object,
    max_consecutive_skips: object = None,
) -> None:
    """Check the loss-scaling settings; shared by ``AmpConfig``, ``GradScaler``'s constructor,
    ``set_init_loss_scaling`` and ``load_state_dict``.

    The scale and its bounds must be real numbers (not bools or strings), finite and > 0 also as
    a float32 (the loss scale is a float32 tensor: 1e39 would be inf there).

    Raises:
        TypeError: a value of the wrong type, naming it.
        ValueError: a value out of range, naming it, the limit and the fix.
    """
    init = _number("init_loss_scaling", init_loss_scaling)
    low = _number("min_loss_scaling", min_loss_scaling)
    high = _number("max_loss_scaling", max_loss_scaling)
    for name, value in (("init_loss_scaling", init), ("min_loss_scaling", low),
                        ("max_loss_scaling", high)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0. Received: {name}={value!r}")
        _check_float32_scale(name, value)
    if low > high:
        raise ValueError(
            f"min_loss_scaling ({low!r}) must not exceed max_loss_scaling ({high!r})."
        )
    if not low <= init <= high:
        side, bound, name = ("below", low, "min_loss_scaling") if init < low else ("above", high, "max_loss_scaling")
        raise ValueError(
            f"init_loss_scaling={init_loss_scaling!r} is {side} {name}={bound!r}: the scale must lie within its "
            f"bounds. Change init_loss_scaling or {name}."
        )
    if _number("incr_ratio", incr_ratio) <= 1.0:
        raise ValueError(f"incr_ratio must be > 1.0. Received: incr_ratio={incr_ratio!r}")
    decr = _number("decr_ratio", decr_ratio)
    if not 0.0 < decr < 1.0:
        raise ValueError(
            f"decr_ratio must be in (0, 1). Received: decr_ratio={decr_ratio!r}"
        )
    for name, value in (("incr_every_n_steps", incr_every_n_steps),
                        ("decr_every_n_nan_or_inf", decr_every_n_nan_or_inf)):
        if _number(name, value, integer=True) < 1:
            raise ValueError(f"{name} must be >= 1. Received: {name}={value!r}")
    if max_consecutive_skips is not None:
        if _number("max_consecutive_skips", max_consecutive_skips, integer=True) < 1:
            raise ValueError(
                "max_consecutive_skips must be >= 1 or None. "
                f"Received: max_consecutive_skips={max_consecutive_skips!r}"
            )


#: The smallest value float32 rounds up to inf (the largest float32 plus half its last step).
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
#: Half the smallest float32 subnormal: a positive value at or below it is 0 in float32.
_FLOAT32_UNDERFLOW = 2.0**-150


def _check_float32_scale(name: str, value: float) -> None:
    """The loss scale is a float32 tensor: a bound that is inf or 0 there scales every gradient
    to inf (each step skipped) or to 0."""
    if value >= _FLOAT32_OVERFLOW:
        raise ValueError(f"{name}={value!r} is inf as a float32 (the loss scale is a float32 tensor, whose largest "
                         f"value is {FLOAT32_MAX!r}): a scale there would make every scaled gradient inf and skip "
                         f"every step. Use a value <= {FLOAT32_MAX!r} (max_loss_scaling's default).")
    if value <= _FLOAT32_UNDERFLOW:
        raise ValueError(f"{name}={value!r} is 0 as a float32 (the loss scale is a float32 tensor, whose smallest "
                         f"positive value is {2.0**-149!r}): use a value >= 1.0 for a loss scale.")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {_describe(value)} as TOML")
