"""``paddle.Model.fit`` (hapi) with this package.

hapi builds its GradScaler as ``paddle.amp.GradScaler(**amp_configs)`` at the first training
batch, so under :func:`paddle_amp_ext.routed` it is this package's scaler (hooks through
``on_scaler``) with no private attribute touched. hapi's ``prepare(amp_configs=...)`` accepts
only ``level``, the op lists and Paddle's scaler arguments (a ``dtype`` key is an error on both
2.6 and 3.x): :func:`hapi_amp_configs` builds a dict it accepts.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..config import AmpConfig

#: What ``paddle.Model.prepare(amp_configs=...)`` accepts besides ``level`` (Paddle 2.6 and 3.x).
HAPI_KEYS = ("custom_white_list", "custom_black_list", "custom_black_varnames", "init_loss_scaling", "incr_ratio",
             "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf", "use_dynamic_loss_scaling")


def hapi_amp_configs(config: Optional[AmpConfig] = None, *, enabled: bool = True, **overrides: Any
                     ) -> Optional[Dict[str, Any]]:
    """``amp_configs`` for ``paddle.Model.prepare``: only the keys hapi accepts.

    Args:
        config: an :class:`AmpConfig` (its level, op lists and Paddle's scaler settings).
        enabled: False gives None (hapi's "AMP off").
        **overrides: more hapi keys (``level``, ``init_loss_scaling``, ...).

    Returns:
        The dict for ``prepare(amp_configs=...)``, or None when ``enabled`` is False.

    Raises:
        ValueError: an override hapi would reject, naming it (``dtype``: use ``routed(config)``).

    Example:
        >>> hapi_amp_configs(AmpConfig(init_loss_scaling=1024.0))["init_loss_scaling"]
        1024.0
    """
    if not enabled:
        return None
    unknown = sorted(set(overrides) - set(HAPI_KEYS) - {"level"})
    if unknown:
        hint = " hapi has no dtype key: pass the dtype in an AmpConfig to paddle_amp_ext.routed()." \
            if "dtype" in unknown else ""
        raise ValueError(f"paddle.Model.prepare(amp_configs=...) does not accept {unknown}.{hint}")
    out: Dict[str, Any] = {}
    if config is not None:
        out["level"] = config.level
        if config.custom_white_list:
            out["custom_white_list"] = list(config.custom_white_list)
        if config.custom_black_list:
            out["custom_black_list"] = list(config.custom_black_list)
        for key in ("init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf",
                    "use_dynamic_loss_scaling"):
            out[key] = getattr(config, key)
    out.setdefault("level", "O1")
    out.update(overrides)
    return out
