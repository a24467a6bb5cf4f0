"""Dynamic loss-scale arithmetic on host floats: bounds, hysteresis, counters.

Pure Python, no Paddle: the scaler asks it what the next scale is, and it answers exactly
(``init * incr**k * decr**j``, clamped to ``[min_scale, max_scale]``).

Example:
    >>> s = DynamicLossScale(init=1024.0, incr_every_n_steps=2)
    >>> [s.update(found_inf) for found_inf in (False, False, True)]
    [1024.0, 2048.0, 1024.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping

import numpy as np

from .config import FLOAT32_MAX, HYSTERESIS, validate_scaling

STATE_VERSION = 1
#: The keys Paddle's own ``GradScaler.state_dict()`` has; ours adds bounds, hysteresis, counters.
PADDLE_KEYS = ("scale", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
               "incr_count", "decr_count", "use_dynamic_loss_scaling")


@dataclass
class DynamicLossScale:
    """Paddle's update rule, plus bounds and a choice of hysteresis.

    ``hysteresis="consecutive"`` is Paddle's rule: the scale drops after
    ``decr_every_n_nan_or_inf`` inf/nan steps in a row (a finite step resets the count).
    ``"cumulative"`` counts inf/nan steps since the last scale change, finite ones in between
    included, so sporadic overflows still lower the scale.
    """

    init: float
    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 2000
    decr_every_n_nan_or_inf: int = 1
    min_scale: float = 1.0
    max_scale: float = FLOAT32_MAX
    hysteresis: str = "consecutive"
    dynamic: bool = True
    incr_count: int = 0
    decr_count: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    steps: int = 0

    def __post_init__(self) -> None:
        self.scale = float(self.init)

    def update(self, found_inf: bool, adjust: bool = True) -> float:
        """Account for one iteration; return the scale for the next one.

        ``adjust=False`` counts the iteration and the skip without touching the scale (loss
        scaling is off, but a non-finite step was still skipped).
        """
        self.steps += 1
        if found_inf:
            self.skipped_steps += 1
            self.consecutive_skips += 1
        else:
            self.consecutive_skips = 0
        if not (self.dynamic and adjust):
            return self.scale
        if found_inf:
            self.incr_count = 0
            self.decr_count += 1
            if self.decr_count >= self.decr_every_n_nan_or_inf:
                self.scale = min(self.scale, max(self.scale * self.decr_ratio, self.min_scale))
                self.decr_count = 0
        else:
            if self.hysteresis == "consecutive":
                self.decr_count = 0
            self.incr_count += 1
            if self.incr_count >= self.incr_every_n_steps:
                self.scale = max(self.scale, min(self.scale * self.incr_ratio, self.max_scale))
                self.incr_count = 0
                self.decr_count = 0
        return self.scale

    @property
    def at_minimum(self) -> bool:
        return self.scale <= self.min_scale

    def state_dict(self) -> Dict[str, Any]:
        return {
            "scale": self.scale,
            "incr_ratio": self.incr_ratio,
            "decr_ratio": self.decr_ratio,
            "incr_every_n_steps": self.incr_every_n_steps,
            "decr_every_n_nan_or_inf": self.decr_every_n_nan_or_inf,
            "incr_count": self.incr_count,
            "decr_count": self.decr_count,
            "use_dynamic_loss_scaling": self.dynamic,
            "min_loss_scaling": self.min_scale,
            "max_loss_scaling": self.max_scale,
            "hysteresis": self.hysteresis,
            "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips,
            "steps": self.steps,
        }

    def export_state(self) -> Dict[str, Any]:
        """Versioned state with Paddle's keys (``scale`` as a float32 array of shape [1])."""
        state = self.state_dict()
        state["scale"] = np.array([self.scale], dtype=np.float32)
        state["version"] = STATE_VERSION
        return state

    def import_state(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`export_state` output, or ``paddle.amp.GradScaler.state_dict()``.

        Every value is checked before anything changes, with the rules the constructor applies.

        Raises:
            TypeError: not a mapping, or a value of the wrong type (naming the key).
            RuntimeError: an empty dict (saved from a disabled Paddle scaler).
            ValueError: a missing key, an out-of-range value (naming key, value and fix), or a
                state dict from a newer paddle-amp-ext.
        """
        if not isinstance(state, Mapping):
            raise TypeError("load_state_dict expects the dict from GradScaler.state_dict(). "
                            f"Received: {state!r} (of type {type(state).__name__})")
        if not state:
            raise RuntimeError("The scaler state dict is empty: it was saved from a disabled "
                               "paddle.amp.GradScaler, so there is no loss scale to resume.")
        version = state.get("version", 0)
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
            raise TypeError(f"Scaler state dict key 'version' must be an int. Received: {version!r}")
        if version > STATE_VERSION:
            raise ValueError(f"Scaler state dict version {version} is newer than this "
                             f"paddle-amp-ext supports ({STATE_VERSION}): upgrade paddle-amp-ext.")
        missing = [key for key in PADDLE_KEYS if key not in state]
        if missing:
            raise ValueError(f"Scaler state dict is missing {missing}: pass the dict from "
                             f"GradScaler.state_dict(). Received keys: {sorted(map(str, state))}")
        loaded = _checked_state(state, self)
        for name, value in loaded.items():
            setattr(self, name, value)


def _checked_state(state: Mapping[str, Any], current: DynamicLossScale) -> Dict[str, Any]:
    """The policy fields from a state dict, each checked; raises naming the key."""
    def fail(key: str, error: Exception) -> Exception:
        return type(error)(f"Scaler state dict key {key!r}: {error}")

    raw = state["scale"]
    try:
        as_array = np.asarray(raw)
        if as_array.dtype.kind not in "iuf":  # a str, bool or object is not a scale (np.asarray('1024') is)
            raise TypeError(f"dtype {as_array.dtype}")
        scale = as_array.astype(np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Scaler state dict key 'scale' must be a number or a 1-element float array, as "
                        f"GradScaler.state_dict() saves it. Received: {raw!r} (of type {type(raw).__name__})") from exc
    if scale.size != 1:
        raise ValueError(f"Scaler state dict key 'scale' must hold one value. Received: {state['scale']!r}")
    dynamic = state["use_dynamic_loss_scaling"]
    if not isinstance(dynamic, (bool, np.bool_)):
        raise TypeError("Scaler state dict key 'use_dynamic_loss_scaling' must be True or False. "
                        f"Received: {dynamic!r} (of type {type(dynamic).__name__})")
    hysteresis = state.get("hysteresis", current.hysteresis)
    if hysteresis not in HYSTERESIS:
        raise ValueError(f"Scaler state dict key 'hysteresis' must be one of {HYSTERESIS}. Received: {hysteresis!r}")
    low = state.get("min_loss_scaling", current.min_scale)
    high = state.get("max_loss_scaling", current.max_scale)
    values = dict(init_loss_scaling=_onto_bound(float(scale[0]), low, high), incr_ratio=state["incr_ratio"],
                  decr_ratio=state["decr_ratio"], incr_every_n_steps=state["incr_every_n_steps"],
                  decr_every_n_nan_or_inf=state["decr_every_n_nan_or_inf"],
                  min_loss_scaling=low, max_loss_scaling=high)
    try:
        validate_scaling(**values)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"Scaler state dict: {exc}") from None
    counters = {}
    for key in ("incr_count", "decr_count", "skipped_steps", "consecutive_skips", "steps"):
        value = state.get(key, getattr(current, key))
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise fail(key, ValueError(f"must be an int >= 0. Received: {value!r}"))
        counters[key] = int(value)
    return dict(scale=values["init_loss_scaling"], incr_ratio=float(values["incr_ratio"]),
                decr_ratio=float(values["decr_ratio"]), incr_every_n_steps=int(values["incr_every_n_steps"]),
                decr_every_n_nan_or_inf=int(values["decr_every_n_nan_or_inf"]),
                min_scale=float(values["min_loss_scaling"]), max_scale=float(values["max_loss_scaling"]),
                hysteresis=str(hysteresis), dynamic=bool(dynamic), **counters)


def _onto_bound(scale: float, low: Any, high: Any) -> float:
    """``scale`` put back on a bound that float32 cannot hold exactly and rounded it off.

    ``scale`` is saved as float32 (Paddle's format), so a scale sitting on ``min_loss_scaling=1e-4``
    comes back as 9.99999975e-05, below the bound: it is the bound if both round to one float32.
    Anything else is left for validation to judge.
    """
    for bound in (low, high):
        if np.float32(scale) == _float32(bound):
            return float(bound)
    return scale


def _as_float(value: Any) -> float:
    """``value`` as a float where it is a real number (not a bool), else NaN (no comparison holds)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return float("nan")
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        return float("nan")


def _float32(value: Any) -> np.float32:
    with np.errstate(over="ignore"):
        return np.float32(_as_float(value))
