"""The skip strategy's interface: what one distributed layout answers for the skip decision."""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from ..._compat import fleet as _fleet
from ..clips import LocalNormClip
from ..flags import Flag, all_reduce_max
from ..layout import Layout


class SkipStrategy:
    """How one layout decides whether an optimizer step is skipped, the same on every rank.

    One small object per layout (one file each in :mod:`paddle_amp_ext.distributed.skip`),
    chosen once per optimizer by :func:`~paddle_amp_ext.distributed.skip.strategy_of`. It answers:
    which gradients a flag or norm computed before the step describes (:attr:`gradients`), where
    the clip runs (:attr:`clips_in_step`), whether that norm is already global
    (:attr:`norm_is_global`), which collective agrees a found_inf flag (:meth:`agree`), and which
    reduction the decision can ride on instead (:meth:`recorder`, the clip the optimizer's step
    calls, whose reduced norm is judged).

    Attributes:
        layout: the optimizer's :class:`~paddle_amp_ext.distributed.Layout`.
    """

    #: the layout kind this strategy serves (the key of the decision map)
    name: ClassVar[str] = ""
    #: what a gradient read before ``optimizer.step()`` holds on this rank
    gradients: ClassVar[str] = ""
    #: the clip (and the norm a skip can ride on) runs inside ``optimizer.step()``, on the
    #: gradients the step reduced
    clips_in_step: ClassVar[bool] = False
    #: a norm or flag computed from the gradients before the step is the same on every rank
    norm_is_global: ClassVar[bool] = False
    #: the optimizer's own ``ClipGradByGlobalNorm`` sees the global norm inside its step, so a
    #: skip with no clip of ours can ride on it (besides :attr:`clips_in_step`)
    own_clip_is_global: ClassVar[bool] = False
    #: a guarded plain ``optimizer.step()`` (a bf16 Trainer's) rides on the optimizer's own clip
    #: instead of agreeing its flag first (where that saves the only collective of ours)
    guard_rides_on_own_clip: ClassVar[bool] = False

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        """``flag`` (this rank's found_inf, already :func:`~paddle_amp_ext.distributed.flags.checked_flag`-ed)
        as every rank sees it; every rank calls it at the same point of the step.

        Args:
            flag: this rank's flag.
            optimizer: the optimizer about to step.
            scaler: the scaler whose ``_unscale`` produced ``flag`` (fleet's or ``dist.shard_scaler``'s
                may have agreed it already), or None.

        Returns:
            The agreed flag.
        """
        raise NotImplementedError

    def recorder(self, optimizer: Any, clip: Any) -> Any:
        """The clip the optimizer's step calls to reduce (and keep) the global norm, clipping by
        ``clip`` (a ``ClipGradByGlobalNorm``) or measuring only (None). No collective here; the
        step runs the recorder's."""
        return LocalNormClip(None if clip is None else clip.clip_norm)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.layout!r})"


def agreed_by_scaler(scaler: Optional[Any]) -> bool:
    """Whether fleet (or ``dist.shard_scaler``) replaced the scaler's ``_unscale`` by one that
    agrees found_inf itself: no second collective is needed (attribute reads only)."""
    return scaler is not None and _fleet.unscale_reduces_found_inf(scaler)


class ReducedInStep(SkipStrategy):
    """A layout whose ``optimizer.step()`` reduces the gradients (fleet's hybrid, stage 2/3):
    before it a rank holds its own unreduced gradient or its share, so its flag is agreed by one
    MAX all-reduce over the world (none where fleet's ``_unscale`` agreed it), and the clip runs
    inside the step."""

    clips_in_step = True

    def agree(self, flag: Flag, optimizer: Any, scaler: Optional[Any] = None) -> Flag:
        return flag if agreed_by_scaler(scaler) else all_reduce_max(flag)
