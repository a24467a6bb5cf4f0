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

STATE_VERSION = 1


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
    max_scale: float = 2.0**24
    hysteresis: str = "consecutive"
    dynamic: bool = True
    incr_count: int = 0
    decr_count: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    steps: int = 0

    def __post_init__(self) -> None:
        self.scale = float(self.init)

    def update(self, found_inf: bool) -> float:
        """Account for one iteration; return the scale for the next one."""
        self.steps += 1
        if found_inf:
            self.skipped_steps += 1
            self.consecutive_skips += 1
        else:
            self.consecutive_skips = 0
        if not self.dynamic:
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

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load our keys, or the subset Paddle's own ``GradScaler.state_dict()`` has."""
        self.scale = float(state["scale"])
        self.incr_ratio = float(state["incr_ratio"])
        self.decr_ratio = float(state["decr_ratio"])
        self.incr_every_n_steps = int(state["incr_every_n_steps"])
        self.decr_every_n_nan_or_inf = int(state["decr_every_n_nan_or_inf"])
        self.incr_count = int(state["incr_count"])
        self.decr_count = int(state["decr_count"])
        self.dynamic = bool(state["use_dynamic_loss_scaling"])
        self.min_scale = float(state.get("min_loss_scaling", self.min_scale))
        self.max_scale = float(state.get("max_loss_scaling", self.max_scale))
        self.hysteresis = str(state.get("hysteresis", self.hysteresis))
        self.skipped_steps = int(state.get("skipped_steps", self.skipped_steps))
        self.consecutive_skips = int(state.get("consecutive_skips", self.consecutive_skips))
        self.steps = int(state.get("steps", self.steps))

    def export_state(self) -> Dict[str, Any]:
        """Versioned state with Paddle's keys (``scale`` as a float32 array of shape [1])."""
        state = self.state_dict()
        state["scale"] = np.array([self.scale], dtype=np.float32)
        state["version"] = STATE_VERSION
        return state

    def import_state(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`export_state` output, or ``paddle.amp.GradScaler.state_dict()``.

        Raises:
            RuntimeError: an empty dict (saved from a disabled Paddle scaler).
            ValueError: a state dict from a newer paddle-amp-ext.
        """
        if not state:
            raise RuntimeError("The scaler state dict is empty: it was saved from a disabled "
                               "GradScaler, so there is no loss scale to resume.")
        version = int(state.get("version", 0))
        if version > STATE_VERSION:
            raise ValueError(f"Scaler state dict version {version} is newer than this "
                             f"paddle-amp-ext supports ({STATE_VERSION}): upgrade paddle-amp-ext.")
        loaded = dict(state)
        loaded["scale"] = float(np.asarray(loaded["scale"], dtype=np.float64).reshape(-1)[0])
        self.load_state_dict(loaded)
