"""The FP8 doctor and advisor: which layer and tensor lose most, and the config that keeps them out.

Example:
    >>> with fp8_linears(model, "current") as stats:        # doctest: +SKIP
    ...     model(x).mean().backward()
    >>> print(diagnose(stats))                              # doctest: +SKIP
    >>> config = advise_fp8(stats, AmpConfig(dtype="bfloat16"))  # doctest: +SKIP
    >>> config.fp8_exclude_layers                           # doctest: +SKIP
    ('lm_head',)
"""

from __future__ import annotations

from typing import Optional

from ..config import AmpConfig
from .stats import Fp8Stats

#: A tensor that saturates or flushes more than this fraction of its values is a loss to act on.
THRESHOLD = 0.01


def _check(stats: object, threshold: float) -> None:
    if not isinstance(stats, Fp8Stats):
        raise TypeError(f"stats must be the Fp8Stats that fp8_linears yields. Received: {type(stats).__name__}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
        raise ValueError(f"threshold must be a fraction in [0, 1). Received: threshold={threshold!r}")


def diagnose(stats: Fp8Stats, threshold: float = THRESHOLD) -> str:
    """One paragraph: the layer and tensor (input, weight, output gradient) that lose most, and
    the fix; or that nothing loses more than ``threshold`` of its values.

    Raises:
        TypeError: ``stats`` is not an :class:`Fp8Stats`.
        ValueError: ``threshold`` is not in [0, 1).
    """
    _check(stats, threshold)
    rows = stats.summary()
    if not rows:
        return "No FP8 quantization was recorded: run the model inside fp8_linears(model, ...) first."
    worst = stats.worst(threshold)
    if worst is None:
        return (f"FP8 loses little: no tensor of {len({row['layer'] for row in rows})} FP8 linears saturates or "
                f"flushes more than {threshold:.1%} of its values.")
    return worst["fix"] + "."


def advise_fp8(stats: Fp8Stats, config: Optional[AmpConfig] = None, threshold: float = THRESHOLD) -> AmpConfig:
    """``config`` (default ``AmpConfig()``) with ``fp8_exclude_layers`` extended by every layer
    one of whose tensors saturates or flushes more than ``threshold`` of its values.

    Raises:
        TypeError: ``stats`` is not an :class:`Fp8Stats` or ``config`` not an :class:`AmpConfig`.
        ValueError: ``threshold`` is not in [0, 1).
    """
    _check(stats, threshold)
    config = AmpConfig() if config is None else config
    if not isinstance(config, AmpConfig):
        raise TypeError(f"config must be an AmpConfig. Received: {type(config).__name__}")
    lossy = [row["layer"] for row in stats.summary() if row["saturated"] + row["flushed"] > threshold]
    keep = list(config.fp8_exclude_layers)
    keep += [name for name in dict.fromkeys(lossy) if name not in keep]
    return config.replace(fp8_exclude_layers=tuple(keep))
