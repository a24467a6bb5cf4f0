"""PaddleFormers' or PaddleNLP's ``Trainer`` with this package: the AMP tags next to the Trainer's own VisualDL logs.

Three lines (the Trainer builds ``paddle.amp.GradScaler`` in its constructor and binds
``paddle.amp.auto_cast`` when its ``trainer`` module is imported, so route first)::

    import paddle_amp_ext as amp
    amp.route()                                              # before importing paddleformers.trainer
    trainer = Trainer(..., callbacks=[AmpCallback()])        # from paddle_amp_ext.integrations.paddlenlp

The Trainer reads ``_cache_found_inf`` / ``_cache_founf_inf`` right after ``scaler.step()`` to
decide whether the optimizer ran (and so whether to step the LR scheduler); this package's
scaler sets them after every step, so every skipped step is seen.

PaddleFormers (the successor, Paddle 3) and PaddleNLP share the callback interface: the
callback is a ``TrainerCallback`` of whichever is installed (the one already imported when both
are, else PaddleFormers). Importing this module imports that toolkit's ``trainer`` module; the
package never imports this module itself.
"""

from __future__ import annotations

import importlib
import sys
import weakref
from typing import Any, Optional

from .. import _compat, lrhold
from .._log import warn_once
from ..dashboards import backends, metrics
from ..scaler import GradScaler
from ..visualdl import VisualDLHook
from ..visualdl.writer import check_flush_bounds

#: The toolkits whose ``trainer.TrainerCallback`` the callback can be, in order of preference.
TOOLKITS = ("paddleformers", "paddlenlp")


def _trainer_callback_class() -> type:
    """``TrainerCallback`` of the toolkit already imported, else of the first one that imports."""
    order = sorted(TOOLKITS, key=lambda name: name not in sys.modules)  # stable: preference kept within each group
    errors = []
    for name in order:
        try:
            return importlib.import_module(f"{name}.trainer").TrainerCallback
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("paddle_amp_ext.integrations.paddlenlp needs PaddleFormers or PaddleNLP: "
                      "pip install paddleformers (Paddle 3) or paddlenlp. " + "; ".join(errors))


TrainerCallback = _trainer_callback_class()


def _trainers_scaler() -> Optional[GradScaler]:
    """The GradScaler a Trainer with ``fp16=True`` built, when it can be told before training: the
    Trainers hand their scaler to callbacks only at ``on_optimizer_begin``, after the first step's
    ``scale()``. It is the one scaler the active routing built that is alive, else the one of them
    that has not stepped yet; None when that is not one scaler (the hook then attaches at
    ``on_optimizer_begin``, and the first step's ``amp/loss`` is not logged)."""
    from ..run.routing import active_routing

    routing = active_routing()
    built = routing.scalers if routing is not None else []
    if len(built) > 1:
        built = [scaler for scaler in built if scaler.last_result is None]
    return built[0] if len(built) == 1 else None


def _run_first(callback: Any) -> bool:
    """Move ``callback`` to the front of the Trainer's callbacks, from inside one of its events.

    The Trainers call their callbacks in list order, their own reporting callbacks (VisualDL,
    TensorBoard, W&B, SwanLab: ``report_to``) first and the user's last, and hand a callback no
    reference to the list; the handler that is calling is ``self`` in the frame of its
    ``call_event`` (PaddleNLP 2.8.1 and PaddleFormers 1.2.0, from reading their
    ``trainer_callback.py``), one or two frames up. Moving the one being called to the front
    during the loop changes no other callback's turn.

    Returns:
        True when moved (or first already), False when the handler was not found.
    """
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return False
        handler = frame.f_locals.get("self")
        callbacks = getattr(handler, "callbacks", None)
        if isinstance(callbacks, list) and any(cb is callback for cb in callbacks):
            if callbacks[0] is not callback:
                callbacks.remove(callback)
                callbacks.insert(0, callback)
            return True
        frame = frame.f_back
    return False


class AmpCallback(TrainerCallback):
    """The AMP tags for the Trainer's steps, and the non-finite guard where the Trainer has no scaler.

    With loss scaling (``fp16=True``) the Trainer's scaler is this package's (route first): a
    :class:`paddle_amp_ext.VisualDLHook` is attached to it. Without (``bf16=True``, or float32),
    the Trainer calls ``optimizer.step()`` and ``lr_scheduler.step()`` itself, so before the first
    step the callback guards its optimizer with :func:`paddle_amp_ext.guard_optimizer` (or uses
    the guard a routing put on it as it was built, and leaves that one in place; a step
    whose gradients hold inf/nan is not applied, and is counted), holds its LR scheduler on a
    skipped step (as the Trainer does itself with a scaler: :mod:`paddle_amp_ext.lrhold`, active
    while training) and attaches the hook to the guard; both are undone at the end of training. A
    guard the user put on the optimizer before is used as it is (its settings kept) and left in
    place at the end: only the hook and the hold the callback added end. ``amp/loss`` is not logged there
    (no scaler sees the loss). With a scaler the hook is attached when training begins, so
    ``amp/loss`` starts at the first step (the routing's scaler; a scaler it cannot tell apart from
    others is attached at the first ``on_optimizer_begin``, after that step's loss).

    Args:
        logdir: where the hook writes its run directory; default the Trainer's
            ``args.logging_dir`` (beside the Trainer's own VisualDL records).
        flush_every: the hook writes after this many steps at the latest.
        flush_secs: the hook writes what waits after this many seconds at the latest (a
            background thread, also when no further step comes; see :class:`VisualDLHook`).
        guard: guard the optimizer of a Trainer without a scaler (one host sync per step).
        report_to: the dashboards the hook writes (as for :class:`VisualDLHook`), or ``"none"``:
            no hook, the values go only into the Trainer's own logs.

    The hook logs every :data:`paddle_amp_ext.visualdl.TAGS` tag, ``amp/loss_scale`` included
    (but ``amp/loss`` on the guard); the scaler is asked to record the grad norm
    (``record_grad_norm``: one norm of the gradients per step, on the device).

    On the Trainer's logging steps the callback adds the registry's Trainer keys (``loss_scale``,
    ``skipped_steps``, ``grad_norm``: :data:`paddle_amp_ext.dashboards.metrics.METRICS`) to the
    Trainer's ``logs``, so the Trainer's own ``report_to`` shows them (``train/loss_scale``...):
    at ``on_train_begin`` it moves itself before the Trainer's reporting callbacks. The loss
    scale and the skip count are host values; the grad norm is one scalar read per logging
    step, after the Trainer's own ``loss.item()`` synchronized the device. A key the Trainer
    set itself is left as it is. :meth:`watch_fp8` adds the FP8 tags of an ``fp8_linears`` block.
    """

    def __init__(self, logdir: Optional[str] = None, flush_every: int = 200, flush_secs: float = 1.0,
                 guard: bool = True, report_to: Any = "visualdl") -> None:
        check_flush_bounds(flush_every, flush_secs)
        self.logdir, self.flush_every, self.flush_secs, self.guard = logdir, flush_every, flush_secs, guard
        self.report_to = backends.parse_report_to(report_to, allow_none=True)
        self.hook: Any = None
        self.optimizer_guard: Any = None  # the guard on the Trainer's optimizer (this callback's or the user's)
        self._owns_guard = False  # whether this callback installed it (and so removes it at train end)
        self._source: Any = None  # the scaler or guard the hook is attached to
        self._holding: Any = None  # while this callback holds the LR (lrhold): its deactivate(), run once
        self._fp8: Any = None  # the Fp8Stats every hook of this callback watches

    def watch_fp8(self, stats: Any) -> None:
        """Write the FP8 tags of ``stats`` at every step, as :meth:`VisualDLHook.watch_fp8` does
        (the hook of this training and of later ones); None stops.

        Args:
            stats: the ``Fp8Stats`` that ``fp8_linears(trainer.model, ...)`` yields, or None.

        Raises:
            TypeError: ``stats`` is not an ``Fp8Stats`` or None.

        Example:
            >>> with amp.fp8_linears(trainer.model, "blockwise") as stats:  # doctest: +SKIP
            ...     callback.watch_fp8(stats)
            ...     trainer.train()
        """
        from ..fp8.stats import Fp8Stats

        if stats is not None and not isinstance(stats, Fp8Stats):
            raise TypeError(f"stats must be the Fp8Stats that fp8_linears yields, or None. Received: {stats!r} (of "
                            f"type {type(stats).__name__})")
        if not self.report_to and stats is not None:
            warn_once("paddlenlp:fp8-none", "AmpCallback(report_to='none') has no hook: the FP8 tags are not written.")
        self._fp8 = stats
        if self.hook is not None:
            self.hook.watch_fp8(None)
            self.hook.watch_fp8(stats)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Attach the hook to the Trainer's scaler before the first step's ``scale()`` (so ``amp/loss``
        has the first step too), where that scaler can be told: see :func:`_trainers_scaler`; and
        move this callback before the Trainer's reporting callbacks (see :meth:`on_log`)."""
        if not _run_first(self):
            warn_once("paddlenlp:order", "AmpCallback could not move itself before the Trainer's reporting callbacks: "
                      "loss_scale, skipped_steps and grad_norm reach the Trainer's logs after they wrote them. "
                      "trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(AmpCallback)) does it.")
        if self._source is None and getattr(args, "fp16", False):
            scaler = _trainers_scaler()
            if scaler is not None:
                self._attach(scaler, args)

    def on_optimizer_begin(self, args: Any, state: Any, control: Any, scaler: Any = None, **kwargs: Any) -> None:
        if scaler is None:
            optimizer = kwargs.get("optimizer")
            guard = self.optimizer_guard
            if not self.guard or optimizer is None or (guard is not None and self._source is guard
                                                       and guard.optimizer is optimizer):
                return  # guarded and attached already in this training (with report_to="none" too)
            from ..guard import guard_of, guard_optimizer

            self._end_guard()
            users = guard_of(optimizer)  # a guard the user or a routing installed is used as it is, and left in place
            self._owns_guard = users is None
            self.optimizer_guard = users if users is not None else guard_optimizer(optimizer)
            if kwargs.get("lr_scheduler") is not None:
                self._hold()
            self._attach(self.optimizer_guard, args)
        elif scaler is not self._source:
            if not isinstance(scaler, GradScaler):
                warn_once("paddlenlp:not-routed", "AmpCallback: the Trainer's scaler is Paddle's %s, so no AMP tags "
                          "are logged: call paddle_amp_ext.route() before importing the Trainer "
                          "(paddleformers.trainer or paddlenlp.trainer).", type(scaler).__name__)
                return
            self._attach(scaler, args)

    def _attach(self, source: Any, args: Any) -> None:
        self._close_hook()
        self._source = source
        if isinstance(source, GradScaler):
            source.record_grad_norm = True  # amp/grad_norm, and grad_norm in the Trainer's logs
        if self.report_to:
            self.hook = source.add_hook(VisualDLHook(self.logdir or args.logging_dir, flush_every=self.flush_every,
                                                     flush_secs=self.flush_secs, report_to=self.report_to))
            if self._fp8 is not None:
                self.hook.watch_fp8(self._fp8)

    def _close_hook(self) -> None:
        if self.hook is not None:
            self.hook.close()
            self._source.remove_hook(self.hook)
        self.hook = self._source = None

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        """The Trainer's hook on a logging step: add the loss scale, the skip count and the grad norm
        to its training ``logs`` (keys from the metric registry; not to evaluation logs).

        Args:
            args: the Trainer's arguments.
            state: the Trainer's state.
            control: the Trainer's control.
            logs: the Trainer's logs of this step (changed in place).
        """
        source = self._source
        if not isinstance(logs, dict) or "loss" not in logs or source is None:
            return
        result = source.last_result
        values = {metrics.SKIPPED_STEPS.trainer_key: int(source.skipped_steps)}
        if result is not None:
            values[metrics.LOSS_SCALE.trainer_key] = float(result.loss_scale)
            if result.grad_norm is not None:  # one scalar read, on a logging step (the Trainer synced already)
                values[metrics.GRAD_NORM.trainer_key] = float(_compat.local_value(result.grad_norm))
        for key, value in values.items():
            logs.setdefault(key, value)

    def _hold(self) -> None:
        """Hold the Trainer's LR scheduler on the guard's skipped steps until :meth:`_end_guard`.

        The guard notes every step it decides (:func:`paddle_amp_ext.lrhold.note_step`), so while
        :mod:`~paddle_amp_ext.lrhold` is active the scheduler bound to the optimizer (the one it
        reads its rate from: the Trainer builds it so) does not advance on the Trainer's
        ``lr_scheduler.step()`` after a skipped step. Nothing is put on the scheduler object. The
        activation is counted (beside a routing's, another Trainer's) and ends at train end, or,
        should that never come, when this callback is collected or the process exits.
        """
        if self._holding is None or not self._holding.alive:
            lrhold.activate()
            self._holding = weakref.finalize(self, lrhold.deactivate)

    def _end_guard(self) -> None:
        if self.optimizer_guard is not None and self._owns_guard:
            self.optimizer_guard.remove()
        self._owns_guard = False
        if self._holding is not None:
            self._holding()  # lrhold.deactivate(), once
            self._holding = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_hook()
        self._end_guard()
