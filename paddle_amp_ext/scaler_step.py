"""The step path of :class:`~paddle_amp_ext.GradScaler`: unscale, the skip decision, clip, step.

The skip decision is the optimizer's :class:`~paddle_amp_ext.distributed.SkipStrategy` (chosen
once per optimizer; the decision map is in :mod:`paddle_amp_ext.distributed.skip`), on one of two
roads:

- it rides on the clip's reduced global norm inside ``optimizer.step()``
  (:func:`~paddle_amp_ext.distributed.step_unless_nonfinite`) where a global-norm clip covers
  every gradient and the strategy's step reduces it (fleet, auto-dp; auto-parallel's own clip);
- else this rank's flag (``check_finite_and_unscale`` with loss scaling on, one fused norm per
  gradient off it) is agreed by :meth:`SkipStrategy.agree` and read once.

Host syncs: one bool per ``step()``, the read Paddle's scaler makes too.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any, Iterable, List, Optional, Tuple

import paddle

from . import _compat, lrhold
from ._compat import fleet as _fleet
from .clip import clip_grads_, global_norm, resolve_clip
from .distributed import (
    SkipStrategy,
    agree_found_inf,
    host_bool,
    norm_covers_every_grad,
    step_clipped,
    step_unless_nonfinite,
    strategy_of,
)
from .distributed.flags import checked_flag
from .events import StepResult
from .gradients import Pair, applied_grads, grads_of

#: True while a scaler applies an update it decided (in this thread or task): see :func:`applying`.
_APPLYING: contextvars.ContextVar[bool] = contextvars.ContextVar("paddle_amp_ext_scaler_applying", default=False)


def applying() -> bool:
    """Whether the calling thread is inside a :class:`GradScaler`'s own optimizer call (its
    ``step()``/``minimize()`` decided the step is applied): a guard on that optimizer defers."""
    return _APPLYING.get()


def _parameters_of(optimizer: Any, parameters: Any) -> List[paddle.Tensor]:
    if parameters is None:
        return _compat.optimizer_parameters(optimizer)
    if isinstance(parameters, paddle.nn.Layer):
        raise TypeError("step(parameters=...) takes the parameters, not the model: pass "
                        f"parameters=model.parameters(). Received: a {type(parameters).__name__} layer")
    params = list(parameters)
    bad = [p for p in params if not isinstance(p, paddle.Tensor)]
    if bad:
        raise TypeError(f"step(parameters=...) must be an iterable of parameters. Received an item {bad[0]!r}")
    return params


def check_optimizer(optimizer: Any, method: str) -> None:
    """TypeError for a model (or anything without ``step``) where the optimizer belongs."""
    if isinstance(optimizer, paddle.nn.Layer):
        raise TypeError(f"GradScaler.{method}() takes the optimizer, not the model: call scaler.{method}(optimizer) "
                        f"with the paddle.optimizer that updates the model. Received: a {type(optimizer).__name__} "
                        "layer")
    if not callable(getattr(optimizer, "step", None)):
        raise TypeError(f"GradScaler.{method}() takes an optimizer (an object with a step() method, such as "
                        f"paddle.optimizer.AdamW). Received: {optimizer!r} (of type {type(optimizer).__name__})")


def _covers_every_grad(pairs: List[Pair], judged: List[Pair], clip: Any) -> bool:
    """Whether a clip's global norm saw every judged gradient (the same pairs, none ``need_clip=False``)."""
    return (clip is not None and pairs is judged
            and all(getattr(p, "need_clip", True) is not False for p, _ in pairs))


class StepPath:
    """``unscale_``, ``step``, ``minimize`` and the skip decision (mixed into ``GradScaler``)."""

    _STRATEGIES_ATTR = "_skip_strategies"

    def _strategy(self, optimizer: Any) -> SkipStrategy:
        """The optimizer's skip strategy, chosen at its first step and kept (attribute reads only)."""
        cache = self.__dict__.setdefault(self._STRATEGIES_ATTR, weakref.WeakKeyDictionary())
        try:
            strategy = cache.get(optimizer)
        except TypeError:  # not weakly referable or unhashable: choose every time
            return strategy_of(optimizer)
        if strategy is None:
            strategy = cache[optimizer] = strategy_of(optimizer)
        return strategy

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale now (e.g. before your own clipping).

        Checks them for inf/nan on the device; with several processes whose flags can differ
        (not under plain data parallel: :func:`~paddle_amp_ext.distributed.flags_agree`) the flag
        is agreed here, as the optimizer's skip strategy says (a MAX all-reduce of one value).
        ``step()`` then reads it (its one host sync).

        Args:
            optimizer: the optimizer whose gradients (``main_grad`` where set) are unscaled.

        Raises:
            RuntimeError: called twice for this optimizer, or after ``step()``, before update().
        """
        check_optimizer(optimizer, "unscale_")
        if not self.is_enable():
            return
        grads = grads_of(self._applied(optimizer))
        if "_unscale" in vars(self) and _fleet.unscale_needs_no_collective(self):
            # fleet.distributed_scaler's _unscale adds only a found_inf all-reduce over the world to
            # Paddle's: the arithmetic runs here (the CUDA kernel's on a CPU), then that all-reduce
            found = self._agree(_compat.unscale(self, optimizer, grads, own=True), None)
        else:
            found = self._agree(_compat.unscale(self, optimizer, grads), optimizer, unscaled=True)
        _compat.set_found_flags(self, found=found)
        self._found_by_opt[id(optimizer)] = found

    def _agree(self, found: Any, optimizer: Any, unscaled: bool = False) -> Any:
        """found_inf (a device flag or a Python number) as every rank sees it, by the optimizer's
        skip strategy (:meth:`~paddle_amp_ext.distributed.SkipStrategy.agree`; ``optimizer=None``:
        always agreed), for the scaler and for ``guard_optimizer``."""
        if not self._sync_found_inf:
            return found
        if optimizer is None:
            return agree_found_inf(found)
        return self._strategy(optimizer).agree(checked_flag(found), optimizer, self if unscaled else None)

    def _applied(self, optimizer: Any, parameters: Optional[List[paddle.Tensor]] = None) -> List[Pair]:
        """The (param, gradient) pairs the step applies (:mod:`paddle_amp_ext.gradients`); the
        optimizer guard overrides it for a guarded ``minimize``."""
        return applied_grads(optimizer, parameters)

    def _skip(self, optimizer: Any) -> bool:
        stage = _compat.optimizer_stage(self, optimizer)
        if stage == "STEPPED":
            raise RuntimeError(
                "step() has already been called on this optimizer since the last update(): "
                "call scaler.update() once per iteration, after every optimizer's step()."
            )
        if stage == "INIT":
            self.unscale_(optimizer)
        return host_bool(self._found_by_opt.pop(id(optimizer)))

    def step(  # type: ignore[override]  # returns a StepResult where Paddle returns None
        self, optimizer: Any, parameters: Optional[Iterable[paddle.Tensor]] = None, grad_clip: Any = None
    ) -> StepResult:
        """Unscale (once), clip the unscaled gradients, and step unless inf/nan was found.

        Args:
            optimizer: the Paddle optimizer.
            parameters: whose gradients to clip; default: the optimizer's. The inf/nan check
                always covers every gradient the step applies (:mod:`paddle_amp_ext.gradients`:
                trainable parameters, ``main_grad`` where the optimizer reads it).
            grad_clip: a float max global norm, or a ``paddle.nn.ClipGradByGlobalNorm`` /
                ``ClipGradByNorm`` / ``ClipGradByValue``.

        Returns:
            StepResult(skipped, loss_scale, grad_norm).

        Raises:
            RuntimeError: ``step`` twice for one optimizer before ``update()``.
            TypeError, ValueError: a bad ``grad_clip``; a model (or anything without ``step``)
                passed as ``optimizer``; a ``main_grad`` that is not a float tensor of its
                parameter's shape.
        """
        if self._static:
            return super().step(optimizer)
        check_optimizer(optimizer, "step")
        return self._step(optimizer, parameters, resolve_clip(grad_clip), None)[0]

    def _step(self, optimizer: Any, parameters: Optional[Iterable[paddle.Tensor]], clip: Any,
              minimize: Optional[Tuple[tuple, dict]]) -> Tuple[StepResult, Any]:
        """One optimizer step, for ``step()`` and ``minimize()`` alike: the skip decision (riding on
        the clip's norm, or this rank's flag agreed), the clip, the update
        (``optimizer.minimize(*args, **kwargs)`` when ``minimize`` holds the arguments, else
        :meth:`_apply_step`), the learning rate and the StepResult.

        Returns:
            (the StepResult, what ``optimizer.minimize`` returned, or None).
        """
        enabled = self.is_enable()
        strategy = self._strategy(optimizer)
        in_step = strategy.clips_in_step  # the step reduces the gradients: the clip runs there
        rides = minimize is None and (in_step or (strategy.own_clip_is_global and clip is None))
        needs_params = (parameters is not None or clip is not None or self.record_grad_norm or not enabled
                        or (rides and in_step))
        judged: List[Pair] = self._applied(optimizer) if needs_params else []  # off the plain path
        pairs = judged if parameters is None else self._applied(optimizer, _parameters_of(optimizer, parameters))
        scale_used = self._policy.scale if enabled else 1.0
        norm = out = None
        if rides and self._rides_on_norm(optimizer, clip, parameters, judged, in_step):
            norm, skipped = self._step_on_norm(optimizer, clip, judged, strategy)
        else:
            if enabled:
                skipped = self._skip(optimizer)
            else:
                self._check_plain_step(optimizer)
                skipped = False
            if not skipped and clip is not None and not in_step:
                norm = clip_grads_(pairs, clip)
            if not skipped and not enabled and self._skip_nonfinite:
                reuse = norm if _covers_every_grad(pairs, judged, clip) else None
                skipped, judged_norm = self._nonfinite(optimizer, judged, reuse, strategy)
                if norm is None:  # else the clip's norm (of the gradients it clipped) is the one reported
                    norm = None if in_step else judged_norm  # before the step's reduce: not the global norm
            elif not skipped and norm is None and self.record_grad_norm and not in_step:
                norm = global_norm(grads_of(pairs))
            if not skipped:
                out, stepped_norm = self._apply(optimizer, in_step, clip, parameters, minimize, strategy)
                norm = stepped_norm if in_step and minimize is None else norm
        if enabled:
            _compat.mark_stepped(self, optimizer)
            if not self._policy.dynamic:
                _compat.reset_optimizer_stages(self)
        self._close_step(optimizer, skipped)
        self._last_result = StepResult(skipped=skipped, loss_scale=scale_used, grad_norm=norm)
        return self._last_result, out

    def _apply(self, optimizer: Any, in_step: bool, clip: Any, parameters: Any, minimize: Optional[tuple],
               strategy: SkipStrategy) -> Tuple[Any, Optional[paddle.Tensor]]:
        """Apply a step decided not skipped: (what ``minimize`` returned, the in-step norm)."""
        out = stepped_norm = None
        token = _APPLYING.set(True)  # a routed optimizer guard defers to this decision
        try:
            if minimize is not None:
                out = optimizer.minimize(*minimize[0], **minimize[1])
            else:
                stepped_norm = self._apply_step(optimizer, in_step, clip, parameters, strategy)
        finally:
            _APPLYING.reset(token)
        return out, stepped_norm

    def _rides_on_norm(self, optimizer: Any, clip: Any, parameters: Any, judged: List[Pair], in_step: bool) -> bool:
        """Whether the skip decision can ride on the clip's reduced global norm instead of a found_inf
        all-reduce: the norm covers every gradient
        (:func:`~paddle_amp_ext.distributed.norm_covers_every_grad`; an inf/nan gradient on any rank
        leaves it inf/nan on every rank). With loss scaling off, for the non-finite guard (where
        the step reduces, or auto-parallel's own clip); with it on, where the step reduces only
        (the clip inside the step), on gradients not unscaled yet (no ``unscale_()`` by hand, whose
        flag is agreed already) that need no collective of fleet's to unscale
        (:func:`~paddle_amp_ext._compat.fleet.unscale_needs_no_collective`)."""
        if self.is_enable():
            ready = (in_step and _compat.optimizer_stage(self, optimizer) == "INIT"
                     and _fleet.unscale_needs_no_collective(self))
        else:
            ready = self._skip_nonfinite
        return ready and self._sync_found_inf and norm_covers_every_grad(
            optimizer, clip, parameters, [param for param, _ in judged])

    def _step_on_norm(self, optimizer: Any, clip: Any, judged: List[Pair],
                      strategy: SkipStrategy) -> Tuple[Optional[paddle.Tensor], bool]:
        """Unscale this rank's gradients (loss scaling on; no collective, no host read), then step
        through :func:`~paddle_amp_ext.distributed.step_unless_nonfinite`: the decision is whether
        the clip's reduced global norm is finite (one host read), the same on every rank.

        Returns:
            (the global norm, whether the step was skipped).
        """
        if self.is_enable():
            _compat.unscale(self, optimizer, grads_of(judged), own=True)
        else:
            self._check_plain_step(optimizer)
        token = _APPLYING.set(True)  # a routed optimizer guard defers to this decision
        try:
            norm, skipped = step_unless_nonfinite(optimizer, clip, strategy)  # no found_inf all-reduce
        finally:
            _APPLYING.reset(token)
        if self.is_enable() and norm is not None:  # the agreed flag, where unscale_() leaves it
            _compat.set_found_flags(self, found=paddle.logical_not(paddle.isfinite(norm)))
        return norm, skipped

    def _check_plain_step(self, optimizer: Any) -> None:
        """The misuse check Paddle's stage machine makes, kept while loss scaling is off."""
        if id(optimizer) in self._plain_stepped:
            raise RuntimeError(
                "step() has already been called on this optimizer since the last update(): "
                "call scaler.update() once per iteration, after every optimizer's step()."
            )
        self._plain_stepped.add(id(optimizer))

    def _apply_step(self, optimizer: Any, in_step: bool, clip: Any,
                    parameters: Optional[Iterable[paddle.Tensor]], strategy: SkipStrategy) -> Optional[paddle.Tensor]:
        """Apply the update; return the global norm where the step clipped (``in_step``).

        The optimizer guard applies the call it intercepted instead.
        """
        if in_step:  # the clip runs where the step runs its own
            return step_clipped(optimizer, clip, self.record_grad_norm, parameters, strategy)
        optimizer.step()
        return None

    def _nonfinite(self, optimizer: Any, judged: List[Pair], norm: Optional[paddle.Tensor],
                   strategy: SkipStrategy) -> Tuple[bool, Optional[paddle.Tensor]]:
        """(whether any rank's gradient is inf/nan, the norm it was judged by): one fused norm
        per gradient the step applies (``judged``), the flag agreed by the strategy (none where
        the norm is already the same on every rank: ``norm_is_global``) and one host read;
        ``norm``, a clip's norm of the same gradients, is reused."""
        if norm is None:
            norm = global_norm(grads_of(judged))
        found = paddle.to_tensor([False]) if norm is None else paddle.logical_not(paddle.isfinite(norm))
        return host_bool(found if strategy.norm_is_global else self._agree(found, optimizer)), norm

    def _close_step(self, optimizer: Any, skipped: bool) -> None:
        lrhold.note_step(optimizer, skipped)
        self._last_lr = float(optimizer.get_lr())  # a host value, on a skipped step too (amp/lr on every step)
        self._found_since_update = self._found_since_update or skipped
        self._last_skipped = self._found_since_update
        self._stepped_since_update = True
        _compat.set_found_flags(self, skipped=skipped)

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.minimize(*args, **kwargs)`` unless inf/nan was found, then ``update()``.

        The same step as :meth:`step` (one code path): the skip decision, the learning rate,
        the norm (with ``record_grad_norm``, or while loss scaling is off), the StepResult
        (:attr:`last_result`) and the StepEvent to the hooks. A skipped step returns
        ``(None, None)``. In a static program this is Paddle's ``minimize`` (which needs an
        optimizer from ``paddle.static.amp.decorate``). One host sync (the skip decision), as
        ``step()``.

        Args:
            optimizer: the optimizer.
            *args: passed on to ``optimizer.minimize`` (the scaled loss first, as in Paddle).
            **kwargs: passed on to ``optimizer.minimize``.

        Returns:
            What ``optimizer.minimize`` returns, or ``(None, None)`` on a skipped step.

        Raises:
            RuntimeError: a second step for this optimizer before ``update()``.
        """
        if self._static:
            return super().minimize(optimizer, *args, **kwargs)
        check_optimizer(optimizer, "minimize")
        result, out = self._step(optimizer, None, None, (args, kwargs))
        self.update()
        return (None, None) if result.skipped else out
