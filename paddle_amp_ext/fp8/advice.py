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

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..config import AmpConfig
from .stats import Fp8Stats, fix_for

#: A tensor that saturates or flushes more than this fraction of its values is a loss to act on.
THRESHOLD = 0.01


def _check(stats: object, threshold: float) -> None:
    if not isinstance(stats, Fp8Stats):
        raise TypeError(f"stats must be the Fp8Stats that fp8_linears yields. Received: {type(stats).__name__}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
        raise ValueError(f"threshold must be a fraction in [0, 1). Received: threshold={threshold!r}")


@dataclass(frozen=True)
class Fp8Findings:
    """What an FP8 run lost, from one reduction of its records (:func:`findings`).

    Attributes:
        summary: :meth:`Fp8Stats.summary`'s rows, worst first.
        worst: :meth:`Fp8Stats.worst`'s row (with its ``fix``), or None when nothing loses more
            than ``threshold``.
        diagnosis: :func:`diagnose`'s paragraph.
        lossy_layers: the layers one of whose tensors loses more than ``threshold``, worst first.
        quantizations: how many quantizations were recorded over the whole run (``stats.recorded``).
        layers: how many FP8 linears made them.
    """

    summary: List[dict]
    worst: Optional[dict]
    diagnosis: str
    lossy_layers: Tuple[str, ...]
    quantizations: int
    layers: int

    def advise(self, config: Optional[AmpConfig] = None) -> AmpConfig:
        """:func:`advise_fp8` of these findings.

        Raises:
            TypeError: ``config`` is not an :class:`AmpConfig`.
        """
        config = AmpConfig() if config is None else config
        if not isinstance(config, AmpConfig):
            raise TypeError(f"config must be an AmpConfig. Received: {type(config).__name__}")
        keep = list(config.fp8_exclude_layers)
        keep += [name for name in self.lossy_layers if name not in keep]
        return config.replace(fp8_exclude_layers=tuple(keep))


def findings(stats: Fp8Stats, threshold: float = THRESHOLD) -> Fp8Findings:
    """The summary, the worst tensor, the diagnosis and the layers to keep out, reducing
    ``stats``' records once (the doctor reports all of them).

    Raises:
        TypeError: ``stats`` is not an :class:`Fp8Stats`.
        ValueError: ``threshold`` is not in [0, 1).
    """
    _check(stats, threshold)
    rows = stats.summary()  # the whole run's, as stats.recorded counts it
    layers = len({row["layer"] for row in rows})
    lost = [row for row in rows if row["saturated"] + row["flushed"] > threshold]
    worst = dict(lost[0], fix=fix_for(lost[0])) if lost else None  # rows are sorted: the first loses most
    if not rows:
        text = "No FP8 quantization was recorded: run the model inside fp8_linears(model, ...) first."
    elif worst is None:
        text = (f"FP8 loses little: no tensor of {layers} FP8 linears saturates or flushes more than "
                f"{threshold:.1%} of its values.")
    else:
        text = worst["fix"] + "."
    return Fp8Findings(rows, worst, text, tuple(dict.fromkeys(row["layer"] for row in lost)), stats.recorded, layers)


def diagnose(stats: Fp8Stats, threshold: float = THRESHOLD) -> str:
    """One paragraph: the layer and tensor (input, weight, output gradient) that lose most, and
    the fix; or that nothing loses more than ``threshold`` of its values.

    Raises:
        TypeError: ``stats`` is not an :class:`Fp8Stats`.
        ValueError: ``threshold`` is not in [0, 1).
    """
    return findings(stats, threshold).diagnosis


def advise_fp8(stats: Fp8Stats, config: Optional[AmpConfig] = None, threshold: float = THRESHOLD) -> AmpConfig:
    """``config`` (default ``AmpConfig()``) with ``fp8_exclude_layers`` extended by every layer
    one of whose tensors saturates or flushes more than ``threshold`` of its values.

    Raises:
        TypeError: ``stats`` is not an :class:`Fp8Stats` or ``config`` not an :class:`AmpConfig`.
        ValueError: ``threshold`` is not in [0, 1).
    """
    _check(stats, threshold)
    if config is not None and not isinstance(config, AmpConfig):
        raise TypeError(f"config must be an AmpConfig. Received: {type(config).__name__}")
    return findings(stats, threshold).advise(config)
