"""``guard_optimizer``: the scaler's non-finite guard for loops that call ``optimizer.step()`` themselves.

PaddleNLP's and PaddleFormers' Trainers build no scaler for bfloat16 and call
``optimizer.step()`` themselves, as does any loop without loss scaling: an inf/NaN gradient then
reaches every weight. A guarded optimizer skips such a step, counts it and reports it to hooks,
with no change to the loop::

    guard = paddle_amp_ext.guard_optimizer(optimizer, hooks=[VisualDLHook("runs/x")])
    for x, y in data:                    # the loop is unchanged
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()                 # not applied when a gradient holds inf/nan
        optimizer.clear_grad()
    guard.remove()                       # or: with paddle_amp_ext.guard_optimizer(optimizer): ...

The decision is :class:`GradScaler`'s own with loss scaling off (``skip_nonfinite``): the same
gradients (the ones the call applies, :mod:`paddle_amp_ext.gradients`: trainable parameters
only, ``param.main_grad`` where the optimizer reads it), the same count, limit
(``max_consecutive_skips``) and :class:`StepEvent` to the same hooks, after every guarded call;
and, as the scaler's, each decision is noted for the LR hold (:func:`paddle_amp_ext.lrhold.note_step`).
``optimizer.minimize(loss)`` is guarded too (in dygraph it runs no backward and no ``step()``:
it applies the existing ``param.grad`` tensors of its ``parameters``, which is what it is judged by);
a skipped ``minimize`` returns ``(None, None)``, as ``scaler.minimize`` does.

Syncs once per guarded step (one bool read to the host); with several processes, where the ranks'
flags can differ, one MAX all-reduce first. Why Paddle's own ``found_inf`` variable is not used:
"Notes for maintainers" in the docs.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional

import paddle

from . import _compat
from .config import AmpConfig
from .events import StepResult
from .gradients import Pair, applied_grads
from .scaler import GradScaler
from .scaler import applying as scaler_applying


class _GuardScaler(GradScaler):
    """A scaler with loss scaling off whose step applies the call the guard intercepted."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(enable=False, skip_nonfinite=True, **kwargs)
        self.call: Optional[tuple] = None
        self.returned: Any = None
        self.via = "step"  # or "minimize": which gradients the intercepted call applies
        self.parameters: Optional[list] = None  # the parameters a guarded minimize() names

    def _applied(self, optimizer: Any, parameters: Optional[list] = None) -> List[Pair]:
        return applied_grads(optimizer, self.parameters if parameters is None else parameters, via=self.via)

    def _rides_on_norm(self, optimizer: Any, clip: Any, parameters: Any, judged: list, in_step: bool) -> bool:
        """Where the layout says so (auto-dp: ``guard_rides_on_own_clip``), an intercepted plain
        ``step()`` rides on the optimizer's own global-norm clip, run inside that step (the
        re-entered call passes through): no flag all-reduce. Every other call applies the step
        itself, so its flag is agreed before it."""
        method, args, kwargs = self.call
        if (self.via != "step" or args or kwargs or getattr(method, "__name__", "") != "step"
                or not self._strategy(optimizer).guard_rides_on_own_clip):
            return False
        return super()._rides_on_norm(optimizer, clip, parameters, judged, in_step)

    def _apply_step(self, optimizer: Any, in_step: bool, clip: Any, parameters: Any, strategy: Any) -> None:
        method, args, kwargs = self.call  # no clip of its own: fleet's step clips as it is built to
        self.returned = method(*args, **kwargs)

    def settle(self, max_consecutive_skips: Optional[int], on_collapse: str) -> None:
        """Take these collapse settings (validated as the constructor's), counters kept."""
        config = AmpConfig(max_consecutive_skips=max_consecutive_skips, on_collapse=on_collapse)
        self._max_consecutive_skips, self._on_collapse = config.max_consecutive_skips, config.on_collapse

    def abandon(self) -> None:
        """Forget a step whose optimizer call raised, so the next call is not taken for a second step."""
        self._plain_stepped.clear()
        self._loss_sum = None


class _GuardedCall:
    """What replaces the optimizer's method: the guarded call (``guard`` names its guard)."""

    def __init__(self, guard: OptimizerGuard, original: Callable, via: str) -> None:
        self.guard = guard
        self.original = original
        self.via = via

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.guard._call(self.original, args, kwargs, self.via)


def _minimize_parameters(args: tuple, kwargs: dict) -> Optional[list]:
    """The ``parameters`` of ``minimize(loss, startup_program, parameters, no_grad_set)``; None
    for the optimizer's own (Paddle takes its own where the argument is empty)."""
    parameters = kwargs["parameters"] if "parameters" in kwargs else (args[2] if len(args) > 2 else None)
    return list(parameters) if parameters else None


class OptimizerGuard:
    """The non-finite guard on one optimizer; built by :func:`guard_optimizer`.

    A guarded call computes the global norm of the optimizer's gradients; when it is inf/nan
    (on any rank) the optimizer's method is not called and the call returns None, else it is
    called with the same arguments and its return value returned. Either way one
    :class:`StepEvent` goes to the hooks (``loss`` is what :meth:`record_loss` saw, else None;
    ``result.grad_norm`` the norm; ``next_loss_scale`` 1.0).
    """

    def __init__(self, optimizer: Any, hooks: Iterable[Any], max_consecutive_skips: Optional[int],
                 on_collapse: str, *, defer_to_scaler: bool = False) -> None:
        self._scaler = _GuardScaler(hooks=hooks, max_consecutive_skips=max_consecutive_skips,
                                    on_collapse=on_collapse)
        self._settings = (max_consecutive_skips, on_collapse)
        self._optimizer = optimizer
        self._name = _compat.applying_method(optimizer)
        self._inside = False
        self._defer = defer_to_scaler  # routing's guard: a GradScaler stepping the optimizer decides
        names = [self._name] + (["minimize"] if callable(getattr(optimizer, "minimize", None)) else [])
        # name -> (the guarded call, the instance attribute it replaced, if any)
        self._calls: Dict[str, tuple] = {}
        for name in names:
            wrapper = _GuardedCall(self, getattr(optimizer, name), "minimize" if name == "minimize" else "step")
            self._calls[name] = (wrapper, vars(optimizer).get(name))
            # into the instance itself: dist.shard_optimizer's wrapper forwards setattr to its inner optimizer
            vars(optimizer)[name] = wrapper
        self._wrapper: Optional[_GuardedCall] = self._calls[self._name][0]

    def _call(self, original: Callable, args: tuple, kwargs: dict, via: str = "step") -> Any:
        if self._inside or self._wrapper is None:  # re-entered from the optimizer, or removed
            return original(*args, **kwargs)
        if self._defer and scaler_applying():  # a GradScaler's step already judged these gradients
            return original(*args, **kwargs)
        scaler = self._scaler
        scaler.call, scaler.returned = (original, args, kwargs), None
        scaler.via = via
        scaler.parameters = _minimize_parameters(args, kwargs) if via == "minimize" else None
        self._inside = True
        try:
            with paddle.no_grad():
                scaler.step(self._optimizer)
        except BaseException:
            scaler.abandon()
            raise
        finally:
            self._inside = False
            scaler.call = scaler.parameters = None
            scaler.via = "step"
        scaler.update()
        returned, scaler.returned = scaler.returned, None
        if via == "minimize" and scaler.last_step_skipped:
            return None, None  # what Paddle's and this package's scaler.minimize() return for a skipped step
        return returned

    # ------------------------------------------------------------------ lifetime
    @property
    def optimizer(self) -> Any:
        """The guarded optimizer."""
        return self._optimizer

    @property
    def active(self) -> bool:
        """Whether the optimizer is guarded (False after :meth:`remove`)."""
        return self._wrapper is not None

    def remove(self) -> None:
        """Restore the optimizer's own method (idempotent).

        Where something else replaced the method after the guard, the guard's call stays in
        place but only passes through.
        """
        if self._wrapper is None:
            return
        for name, (wrapper, previous) in self._calls.items():
            if vars(self._optimizer).get(name) is wrapper:
                if previous is None:
                    del vars(self._optimizer)[name]
                else:
                    vars(self._optimizer)[name] = previous
        self._wrapper = None

    def __enter__(self) -> OptimizerGuard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # ------------------------------------------------------------------ hooks and counts
    def add_hook(self, hook: Any) -> Any:
        """Register ``hook``, told after every guarded step, as for the scaler.

        Args:
            hook: an object with ``on_step(event)`` (optional ``on_overflow(event)``), or a callable.

        Returns:
            ``hook``.

        Raises:
            TypeError: ``hook`` has no ``on_step`` and is not callable.
        """
        return self._scaler.add_hook(hook)

    def remove_hook(self, hook: Any) -> None:
        """Unregister ``hook`` (it is not closed).

        Args:
            hook: a registered hook.

        Raises:
            ValueError: ``hook`` is not registered.
        """
        self._scaler.remove_hook(hook)

    @property
    def hooks(self) -> tuple:
        """The registered hooks, in the order they are called."""
        return self._scaler.hooks

    def record_loss(self, loss: paddle.Tensor) -> paddle.Tensor:
        """Give the hooks this step's loss (summed until the next guarded step).

        Only kept while hooks are registered; stays on the device (no sync).

        Args:
            loss: the step's loss.

        Returns:
            ``loss`` itself (no loss scaling here), so it can wrap the expression.
        """
        return self._scaler.scale(loss)

    def step_scheduler(self, lr_scheduler: Any) -> bool:
        """Step ``lr_scheduler`` only if the last guarded step was applied (no host sync).

        Args:
            lr_scheduler: a ``paddle.optimizer.lr.LRScheduler`` (anything with ``step()``).

        Returns:
            Whether it was stepped.
        """
        return self._scaler.step_scheduler(lr_scheduler)

    @property
    def skipped_steps(self) -> int:
        """Guarded steps not applied so far (host int)."""
        return self._scaler.skipped_steps

    @property
    def consecutive_skips(self) -> int:
        """Guarded steps not applied in a row up to the last one (0 after an applied step; host int)."""
        return self._scaler.consecutive_skips

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last guarded step was not applied (host bool)."""
        return self._scaler.last_step_skipped

    @property
    def last_result(self) -> Optional[StepResult]:
        """The StepResult of the last guarded step (None before the first)."""
        return self._scaler.last_result

    def state_dict(self) -> dict:
        """The guard's counters; the optimizer's own ``state_dict()`` is unchanged by the guard.

        Returns:
            Plain values (picklable, ``paddle.save``-able), for :meth:`load_state_dict`.
        """
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the counters saved by :meth:`state_dict`.

        Args:
            state_dict: from :meth:`state_dict`.

        Raises:
            ValueError: a state dict from a newer paddle-amp-ext, or a bad value (named).
        """
        self._scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        state = f"guarding {type(self._optimizer).__name__}.{self._name}" if self.active else "removed"
        return f"OptimizerGuard({state}, skipped_steps={self.skipped_steps})"


def guard_of(optimizer: Any) -> Optional[OptimizerGuard]:
    """The active :class:`OptimizerGuard` on ``optimizer``, or None (reads one attribute, no sync)."""
    state = vars(optimizer) if hasattr(optimizer, "__dict__") else {}
    current = getattr(state.get(_compat.applying_method(optimizer)), "guard", None)
    return current if isinstance(current, OptimizerGuard) and current.active else None


def guard_optimizer(optimizer: Any, hooks: Iterable[Any] = (), *, max_consecutive_skips: Optional[int] = None,
                    on_collapse: str = "warn") -> OptimizerGuard:
    """Guard ``optimizer`` in place: a step whose gradients hold inf/nan is not applied.

    Replaces ``step`` (``_step`` on fleet's ``HybridParallelOptimizer``) and ``minimize`` on this
    object, so a loop or Trainer that calls ``optimizer.step()`` needs no change; everything else
    is untouched. Guarding it again returns its guard with the new ``hooks`` added (a guard a
    routing put on it takes this call's settings). Undo with ``guard.remove()``, or use the guard
    as a context manager. Guard the object the loop calls (fleet's ``MixPrecisionOptimizer.step``
    never calls its inner optimizer's).

    Syncs once per step (one bool read to the host); with several processes, where the ranks'
    flags can differ, one MAX all-reduce first.

    Args:
        optimizer: a Paddle optimizer, or fleet's wrapper of one.
        hooks: objects with ``on_step(event)`` (e.g. ``VisualDLHook``), told after every step.
        max_consecutive_skips: after this many skipped steps in a row, ``on_collapse``.
        on_collapse: ``"warn"`` (log once per collapse) or ``"raise"`` (``AmpOverflowError``
            from the step call).

    Returns:
        The :class:`OptimizerGuard`.

    Raises:
        TypeError: ``optimizer`` has no callable ``step``, or a bad hook or setting.
        ValueError: the optimizer is already guarded with other settings.

    Example::

        guard = paddle_amp_ext.guard_optimizer(optimizer, hooks=[paddle_amp_ext.VisualDLHook("runs/bf16")])
        trainer.train()                        # the Trainer's optimizer.step() calls are guarded
        skipped = guard.skipped_steps          # steps whose inf/nan gradients were not applied
    """
    if not callable(getattr(optimizer, "step", None)) or not hasattr(optimizer, "__dict__"):
        raise TypeError(f"guard_optimizer() needs an optimizer with a step() method (and a __dict__ to "
                        f"replace it in). Received: {optimizer!r} (of type {type(optimizer).__name__})")
    current = guard_of(optimizer)
    if current is not None and current._defer:  # a routing's silent guard: the explicit one takes it over
        current._scaler.settle(max_consecutive_skips, on_collapse)
        current._settings, current._defer = (max_consecutive_skips, on_collapse), False
    if current is not None:
        if current._settings != (max_consecutive_skips, on_collapse):
            raise ValueError(
                f"The optimizer is already guarded with max_consecutive_skips={current._settings[0]!r}, "
                f"on_collapse={current._settings[1]!r}; received max_consecutive_skips={max_consecutive_skips!r}, "
                f"on_collapse={on_collapse!r}. Call guard.remove() first to guard it anew.")
        for hook in hooks or ():
            if not any(hook is known for known in current.hooks):
                current.add_hook(hook)
        return current
    return OptimizerGuard(optimizer, hooks, max_consecutive_skips, on_collapse)


