"""Paddle's older AMP names, as this package's objects: ``amp_guard``, ``amp_decorate``, ``AmpScaler``.

Paddle keeps ``paddle.amp.amp_guard`` and ``amp_decorate`` (the functions ``auto_cast`` and
``decorate`` wrap) and ``paddle.amp.AmpScaler`` (``GradScaler``'s base, with other defaults:
``init_loss_scaling=2**15``, ``incr_every_n_steps=1000``). Here they are the validated versions.
"""

from __future__ import annotations

from typing import Any

from .autocast import auto_cast, decorate
from .scaler import GradScaler

amp_guard = auto_cast
amp_decorate = decorate


class AmpScaler(GradScaler):
    """``paddle.amp.AmpScaler``'s defaults (``2**15``, every ``1000`` steps) on this package's scaler."""

    def __init__(self, enable: Any = True, init_loss_scaling: float = 2.0**15, incr_ratio: float = 2.0,
                 decr_ratio: float = 0.5, incr_every_n_steps: int = 1000, decr_every_n_nan_or_inf: int = 1,
                 use_dynamic_loss_scaling: bool = True, **kwargs: Any) -> None:
        super().__init__(enable, init_loss_scaling, incr_ratio, decr_ratio, incr_every_n_steps,
                         decr_every_n_nan_or_inf, use_dynamic_loss_scaling, **kwargs)
