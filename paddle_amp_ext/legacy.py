"""Paddle's older AMP names, as this package's objects: ``amp_guard``, ``amp_decorate``, ``AmpScaler``.

Paddle keeps ``paddle.amp.amp_guard`` and ``amp_decorate`` (the functions ``auto_cast`` and
``decorate`` wrap) and ``paddle.amp.AmpScaler`` (``GradScaler``'s base, with other defaults:
``init_loss_scaling=2**15``, ``incr_every_n_steps=1000``). Here they are the validated versions.
"""

from __future__ import annotations

from typing import Any

from .autocast import auto_cast, decorate
from .scaler import GradScaler

#: ``paddle.amp.amp_guard``, the older name of :func:`paddle_amp_ext.auto_cast` (the same function).
amp_guard = auto_cast
#: ``paddle.amp.amp_decorate``, the older name of :func:`paddle_amp_ext.decorate` (the same function).
amp_decorate = decorate


class AmpScaler(GradScaler):
    """``paddle.amp.AmpScaler``'s defaults (``2**15``, every ``1000`` steps) on this package's scaler.

    Args:
        enable: as for :class:`paddle_amp_ext.GradScaler`.
        init_loss_scaling: the first loss scale (default ``2**15``, as Paddle's ``AmpScaler``).
        incr_ratio: the factor the scale grows by.
        decr_ratio: the factor the scale shrinks by after an overflow.
        incr_every_n_steps: finite steps in a row before the scale grows (default 1000).
        decr_every_n_nan_or_inf: overflowing steps before the scale shrinks.
        use_dynamic_loss_scaling: change the scale at all.
        **kwargs: this package's extra keywords of :class:`paddle_amp_ext.GradScaler`.
    """

    def __init__(self, enable: Any = True, init_loss_scaling: float = 2.0**15, incr_ratio: float = 2.0,
                 decr_ratio: float = 0.5, incr_every_n_steps: int = 1000, decr_every_n_nan_or_inf: int = 1,
                 use_dynamic_loss_scaling: bool = True, **kwargs: Any) -> None:
        super().__init__(enable, init_loss_scaling, incr_ratio, decr_ratio, incr_every_n_steps,
                         decr_every_n_nan_or_inf, use_dynamic_loss_scaling, **kwargs)
