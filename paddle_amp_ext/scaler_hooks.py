"""The update and reporting side of :class:`~paddle_amp_ext.GradScaler`: ``update()``, the overflow
report, the collapse limit, the hooks told after every iteration, the scheduler step.

No device-to-host sync here: the skip was read in ``step()``; hooks such as ``VisualDLHook`` read
their device values only when they flush.
"""

from __future__ import annotations

from typing import Any

from . import _compat
from ._log import logger, warn_once
from .errors import AmpOverflowError
from .events import StepEvent, StepResult, call_optional


class Reports:
    """``update()``, hooks and the scheduler step (mixed into ``GradScaler``)."""

    def update(self) -> None:
        """Close the iteration: update the scale, count skips, tell the hooks.

        No device-to-host sync (the skip was read in ``step()``); hooks such as ``VisualDLHook``
        read their device values only when they flush.

        Raises:
            AmpOverflowError: ``on_collapse="raise"`` and ``max_consecutive_skips`` skipped
                iterations in a row.
        """
        if self._static:
            return super().update()
        if not self._stepped_since_update:
            logger.debug("update() without step(): nothing to do")
            return
        found = self._found_since_update
        result = self._last_result or StepResult(False, 1.0)  # set by every step()/minimize()
        before = after = self._policy.scale
        after = self._policy.update(found, adjust=self.is_enable())  # off: counts only
        if after != before:
            _compat.set_scaler_scale(self, after)
        _compat.reset_optimizer_stages(self)
        self._plain_stepped.clear()
        event = StepEvent(self._policy.steps - 1, self._loss_sum, result, self._last_lr,
                          after if self.is_enable() else 1.0)
        self._found_since_update = self._stepped_since_update = False
        self._loss_sum = None
        if found:
            self._report_overflow(event, before, after)
        for hook in self._hooks:
            if hasattr(hook, "on_step"):
                hook.on_step(event)
            else:
                hook(event)

    def _report_overflow(self, event: StepEvent, before: float, after: float) -> None:
        if self.is_enable():
            logger.info("Found inf/nan in gradients at step %d: optimizer step skipped; loss scale "
                        "%g -> %g", event.step, before, after)
        else:
            logger.warning("Found inf/nan in gradients at step %d: optimizer step skipped (loss scaling is "
                           "off; the weights keep their last finite values).", event.step)
        for hook in self._hooks:
            call_optional(hook, "on_overflow", event)
        if self._policy.at_minimum:
            warn_once(f"scaler:min:{id(self)}", "Loss scale reached its minimum %g and gradients "
                      "are still inf/nan.", self._policy.min_scale)
        limit = self._max_consecutive_skips
        if limit is not None and self._policy.consecutive_skips >= limit:
            scale_note = f"loss scale now {after:g}" if self.is_enable() else "loss scaling off"
            message = (
                f"{self._policy.consecutive_skips} consecutive steps had inf/nan gradients "
                f"({scale_note}): the model produces inf/nan whatever the scale. "
                "Run paddle_amp_ext.find_overflow(model, ...) (or `python -m "
                "paddle_amp_ext.doctor`) to find the layer, then black-list its op, keep it in "
                "float32, or switch to bfloat16."
            )
            if self._on_collapse == "raise":
                raise AmpOverflowError(message)
            if self._policy.consecutive_skips == limit:
                logger.warning(message)

    # ------------------------------------------------------------------ hooks and state
    def add_hook(self, hook: Any) -> Any:
        """Register ``hook``, told after every ``update()``.

        Args:
            hook: an object with ``on_step(event)`` (optional ``on_overflow(event)``, ``close()``),
                or a callable taking the :class:`StepEvent`.

        Returns:
            ``hook``.

        Raises:
            TypeError: ``hook`` has no ``on_step`` and is not callable.
        """
        if not (hasattr(hook, "on_step") or callable(hook)):
            raise TypeError(f"A hook needs an on_step(event) method or must be callable. Received: {hook!r}")
        self._hooks.append(hook)
        return hook

    def remove_hook(self, hook: Any) -> None:
        """Unregister ``hook`` (it is not closed).

        Args:
            hook: a hook given to :meth:`add_hook` or ``hooks=``.

        Raises:
            ValueError: ``hook`` is not registered.
        """
        self._hooks.remove(hook)

    def step_scheduler(self, lr_scheduler: Any) -> bool:
        """Step ``lr_scheduler`` only if the optimizer really stepped (no host sync).

        Args:
            lr_scheduler: a ``paddle.optimizer.lr.LRScheduler`` (anything with ``step()``).

        Returns:
            Whether it was stepped.
        """
        if self._last_skipped:
            return False
        lr_scheduler.step()
        return True

    @property
    def hooks(self) -> tuple:
        return tuple(self._hooks)
