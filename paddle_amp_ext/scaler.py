"""``GradScaler``: Paddle's scaler with clip-aware ``step``, bounds, reports and no silent collapse.

The recipe (Paddle's documented loop, one argument more)::

    scaler = paddle_amp_ext.GradScaler(init_loss_scaling=2**14)
    with paddle_amp_ext.auto_cast():
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    result = scaler.step(optimizer, grad_clip=1.0)   # unscale, clip, step unless inf/nan
    scaler.update()
    optimizer.clear_grad()

Gradient accumulation over K micro-batches: call ``scaler.scale(loss / K).backward()`` for each,
then ``step``/``update``/``clear_grad`` once. Gradients accumulate scaled by the same scale and
are unscaled once; hooks see the summed loss of the K micro-batches.

Host syncs: ``step()`` reads one bool (found_inf) back from the device to decide whether to
step, as Paddle's own scaler does once per iteration. Nothing else on the per-step path does;
``loss_scale`` is tracked on the host. With more than one process the flag is agreed over the ranks
(one MAX all-reduce) first where the ranks' flags can differ (fleet's sharding, tensor and
pipeline parallel, stage 2/3, ``no_sync`` parameters); under plain data parallel the gradients
are already identical after backward, so no collective runs (as in Paddle's and torch's
scalers). Under fleet the clip runs inside the optimizer's step, on the reduced gradients: see
:mod:`paddle_amp_ext.distributed`. Under fleet with a global-norm clip (``grad_clip=`` or the
optimizer's own), with loss scaling on or off, the skip decision rides on the clip's reduced
norm: no found_inf all-reduce, one collective fewer than Paddle's path. Auto-parallel
DistTensor flags and norms are already global (Paddle's SPMD rules reduced them): no collective
of ours runs on them.
"""

from __future__ import annotations

import contextvars
from typing import Any, Iterable, List, Optional, Tuple, Union

import paddle
from paddle.amp.grad_scaler import GradScaler as PaddleGradScaler  # not paddle.amp's: routing replaces it

from . import _compat, _state, lrhold
from ._compat import fleet as _fleet
from ._log import info_once, logger, warn_once
from .clip import clip_grads_, global_norm, resolve_clip
from .config import FLOAT32_MAX, AmpConfig, validate_scaling
from .device import current_decision
from .distributed import (
    agree_found_inf,
    host_bool,
    layout_of,
    norm_covers_every_grad,
    step_clipped,
    step_unless_nonfinite,
)
from .errors import AmpOverflowError
from .events import StepEvent, StepResult, call_optional
from .gradients import Pair, applied_grads, grads_of
from .lossscale import DynamicLossScale

#: True while a scaler applies an update it decided (in this thread or task): see :func:`applying`.
_APPLYING: contextvars.ContextVar[bool] = contextvars.ContextVar("paddle_amp_ext_scaler_applying", default=False)


def applying() -> bool:
    """Whether the calling thread is inside a :class:`GradScaler`'s own optimizer call (its
    ``step()``/``minimize()`` decided the step is applied): a guard on that optimizer defers."""
    return _APPLYING.get()


_SCALER_DEFAULTS = dict(init_loss_scaling=2.0**16, incr_ratio=2.0, decr_ratio=0.5, incr_every_n_steps=2000,
                       decr_every_n_nan_or_inf=1, use_dynamic_loss_scaling=True, min_loss_scaling=1.0,
                       max_loss_scaling=FLOAT32_MAX, hysteresis="consecutive", max_consecutive_skips=None,
                       on_collapse="warn")


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


def _check_optimizer(optimizer: Any, method: str) -> None:
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


class GradScaler(PaddleGradScaler):
    """Drop-in ``paddle.amp.GradScaler`` (Paddle's arguments and defaults) with more keywords.

    Where it differs from Paddle's scaler on purpose (docs/differences.md, "Where it differs from
    paddle.amp, and why"): the scale is bounded to ``[min_loss_scaling, max_loss_scaling]``
    (Paddle's is unbounded: it can fall to 1e-30 or grow to inf and stay there); ``state_dict()``
    is never empty and ``load_state_dict`` also loads while loss scaling is off (Paddle's returns
    ``{}`` and ignores the load then), so a CPU run's checkpoint resumes on a GPU; ``step()``
    returns a :class:`StepResult`; ``update()`` logs instead of printing. Paddle's attributes
    that programs read keep Paddle's meaning: ``_enable``, ``_scale``, ``_found_inf``,
    ``_cache_found_inf``/``_cache_founf_inf`` (set after every ``step``/``minimize``),
    ``get_init_loss_scaling()`` and ``is_use_dynamic_loss_scaling()`` (False and 1.0 while
    loss scaling is off, as Paddle's).

    Args:
        enable: True, False, or ``"auto"`` (on exactly when the gate picks float16).
        init_loss_scaling: the first loss scale, as in Paddle (default 2**16).
        incr_ratio: the factor the scale grows by, as in Paddle.
        decr_ratio: the factor the scale shrinks by after an overflow, as in Paddle.
        incr_every_n_steps: finite steps in a row before the scale grows, as in Paddle.
        decr_every_n_nan_or_inf: overflowing steps before the scale shrinks, as in Paddle.
        use_dynamic_loss_scaling: change the scale at all, as in Paddle.
        min_loss_scaling: the scale never drops below this (default 1.0: below 1 a scale only
            flushes more fp16 gradients to zero; Paddle has no bound).
        max_loss_scaling: the scale never grows above this (default: the largest float32,
            Paddle's range).
        skip_nonfinite: also when loss scaling is off (bfloat16, float32, a CPU, ``enable=False``),
            do not step the optimizer on inf/nan gradients, and count, report and limit such
            steps like overflow skips (default True). Costs one fused norm per gradient (shared
            with ``grad_clip``) and one device-to-host read per step, the read loss scaling
            makes anyway.
        hysteresis: ``"consecutive"`` (Paddle's) or ``"cumulative"``; see :mod:`lossscale`.
        max_consecutive_skips: after this many skipped iterations in a row, ``on_collapse``.
        on_collapse: ``"warn"`` (log once per collapse) or ``"raise"`` (``AmpOverflowError``).
        hooks: objects with ``on_step(event)`` (e.g. ``VisualDLHook``), see :meth:`add_hook`.
        config: an :class:`AmpConfig` supplying the scaler settings and ``enable``.
        sync_found_inf: agree on found_inf (and the guard's flag) over all ranks before deciding,
            where their flags can differ (default True: one MAX all-reduce, or the clip's reduced
            norm, under fleet's sharding/tensor/pipeline parallel and stage 2/3 and for ``no_sync``
            or ``is_distributed`` parameters; nothing under plain data parallel, whose gradients
            are identical after backward: :func:`~paddle_amp_ext.distributed.flags_agree`). False
            only for a control run: ranks may then diverge or hang.

    Raises:
        ValueError, TypeError: a bad setting, naming it.
    """

    def __init__(
        self,
        enable: Union[bool, str] = True,
        init_loss_scaling: float = 2.0**16,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 2000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
        *,
        min_loss_scaling: float = 1.0,
        max_loss_scaling: float = FLOAT32_MAX,
        hysteresis: str = "consecutive",
        max_consecutive_skips: Optional[int] = None,
        on_collapse: str = "warn",
        hooks: Iterable[Any] = (),
        config: Optional[AmpConfig] = None,
        sync_found_inf: bool = True,
        skip_nonfinite: bool = True,
    ) -> None:
        given = dict(init_loss_scaling=init_loss_scaling, incr_ratio=incr_ratio, decr_ratio=decr_ratio,
                     incr_every_n_steps=incr_every_n_steps, decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
                     use_dynamic_loss_scaling=use_dynamic_loss_scaling, min_loss_scaling=min_loss_scaling,
                     max_loss_scaling=max_loss_scaling, hysteresis=hysteresis,
                     max_consecutive_skips=max_consecutive_skips, on_collapse=on_collapse)
        if config is None:  # one validation path, with AmpConfig's messages
            config = AmpConfig(
                init_loss_scaling=init_loss_scaling, incr_ratio=incr_ratio, decr_ratio=decr_ratio,
                incr_every_n_steps=incr_every_n_steps, decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
                use_dynamic_loss_scaling=use_dynamic_loss_scaling, min_loss_scaling=min_loss_scaling,
                max_loss_scaling=max_loss_scaling, hysteresis=hysteresis,
                max_consecutive_skips=max_consecutive_skips, on_collapse=on_collapse,
            )
        elif not isinstance(config, AmpConfig):
            raise TypeError(f"config must be an AmpConfig. Received: {type(config).__name__}")
        else:
            changed = sorted(k for k, v in given.items() if v != _SCALER_DEFAULTS[k])
            changed += ["enable"] if enable is not True else []
            if changed:
                raise TypeError(f"Pass either config= or {changed}, not both: put them in the AmpConfig "
                                "(config.replace(...)).")
            enable = "auto" if config.dtype == "auto" and config.enable else config.enable
        self._policy = DynamicLossScale(
            init=float(config.init_loss_scaling), incr_ratio=float(config.incr_ratio),
            decr_ratio=float(config.decr_ratio), incr_every_n_steps=int(config.incr_every_n_steps),
            decr_every_n_nan_or_inf=int(config.decr_every_n_nan_or_inf),
            min_scale=float(config.min_loss_scaling), max_scale=float(config.max_loss_scaling),
            hysteresis=config.hysteresis, dynamic=config.use_dynamic_loss_scaling,
        )
        self._init_scale = self._policy.scale
        self._static = _compat.in_static_mode()
        self._max_consecutive_skips = config.max_consecutive_skips
        self._on_collapse = config.on_collapse
        self._sync_found_inf = sync_found_inf
        if not isinstance(skip_nonfinite, bool):
            raise TypeError(f"skip_nonfinite must be True or False. Received: skip_nonfinite={skip_nonfinite!r}")
        self._skip_nonfinite = skip_nonfinite
        self._hooks: List[Any] = []
        if hooks is None:
            hooks = ()
        if isinstance(hooks, (str, bytes)) or not hasattr(hooks, "__iter__"):
            raise TypeError(f"hooks must be a list of hooks, e.g. [VisualDLHook('runs/x')]. Received: hooks={hooks!r}")
        for hook in hooks:
            self.add_hook(hook)
        self._requested = self._resolve_request(enable)
        if self._static:  # a static program: Paddle's scaler builds its persistable scale there
            super().__init__(self._requested, self._policy.scale, self._policy.incr_ratio, self._policy.decr_ratio,
                             self._policy.incr_every_n_steps, self._policy.decr_every_n_nan_or_inf,
                             self._policy.dynamic)
            return
        super().__init__(enable=False)  # Paddle would warn on every CPU construction
        _compat.init_scaler_state(self, self._policy.scale)
        self._dtype_disabled = False
        self._found_by_opt: dict = {}
        self._plain_stepped: set = set()  # optimizers stepped since update() while loss scaling is off
        #: compute the unscaled gradient norm at every step (for hooks) also without ``grad_clip``
        self.record_grad_norm = False
        self._found_since_update = False
        self._stepped_since_update = False
        self._last_skipped = False
        self._last_result: Optional[StepResult] = None
        self._loss_sum: Optional[paddle.Tensor] = None
        self._last_lr: Optional[float] = None
        self._set_active(self._active())

    # ------------------------------------------------------------------ enablement
    def _resolve_request(self, enable: Union[bool, str]) -> bool:
        if enable == "auto":  # on where the gate picks float16, and inside fp16_emulation
            decision = current_decision("auto")
            if not decision.use_loss_scaling:
                info_once(f"scaler:auto:{decision.reason}", "GradScaler(enable='auto') is off: %s",
                          decision.reason)
            self._device_ok = decision.use_loss_scaling
            return True
        if not isinstance(enable, bool):
            raise TypeError(f"enable must be True, False or 'auto'. Received: enable={enable!r}")
        if self._static:  # Paddle's static scaler checks no device
            self._device_ok = True
            return enable
        self._device_ok = _compat.place_kind() != "cpu"
        if enable and not self._device_ok and _state.emulated_dtype() is None:
            warn_once(
                "scaler:cpu",
                "GradScaler: loss scaling is off because Paddle runs on the CPU (no float16 "
                "kernels). step() still clips and steps; inside fp16_emulation() the scaler runs "
                "for real.",
            )
        return enable

    def _set_active(self, active: bool) -> None:
        """Loss scaling on or off, and Paddle's attributes that say so (as Paddle's scaler sets them)."""
        self._enable = active
        self._use_dynamic_loss_scaling = active and self._policy.dynamic
        self._init_loss_scaling = self._init_scale if active else 1.0

    def _active(self) -> bool:
        if not self._requested or self._dtype_disabled:
            return False
        emulated = _state.emulated_dtype()
        if emulated is not None:
            return emulated == "float16"
        return self._device_ok

    # ------------------------------------------------------------------ Paddle API
    def scale(self, var: paddle.Tensor) -> paddle.Tensor:
        """Multiply ``var`` by the loss scale (unchanged when loss scaling is off).

        A static-graph value (``paddle.enable_static()``, ``paddle.jit.to_static``) is scaled by
        Paddle's own static-graph rule. No device-to-host sync.

        Args:
            var: the loss.

        Returns:
            ``var`` times the scale, or ``var`` itself while loss scaling is off (also for an AMP
            dtype other than float16, which turns loss scaling off, logged once).

        Raises:
            TypeError: ``var`` is not a ``paddle.Tensor``.
        """
        if self._static or _compat.is_static_value(var):  # explicit base: to_static converts this method
            return PaddleGradScaler.scale(self, var)
        if not isinstance(var, paddle.Tensor):
            raise TypeError(f"scale() expects a paddle.Tensor loss. Received: {type(var).__name__}")
        if self._hooks:  # only hooks read the loss; without them nothing is kept
            # a DistTensor loss (auto-parallel) is kept as this rank's local value: reading a
            # Partial one on rank 0 alone would be a reshard the other ranks never enter
            detached = _compat.local_value(var.detach())
            self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
        active = self._active()
        if active and _state.emulated_dtype() is None and _compat.amp_state_dtype() != "float16":
            self._dtype_disabled = True
            active = False
            info_once("scaler:dtype", "GradScaler turned off: AMP dtype is %s, which needs no loss "
                      "scaling.", _compat.amp_state_dtype())
        self._set_active(active)
        if not active:
            return var
        return var * _compat.scaler_scale_tensor(self)

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale now (e.g. before your own clipping).

        Checks them for inf/nan on the device; with several processes whose flags can differ
        (not under plain data parallel: :func:`~paddle_amp_ext.distributed.flags_agree`) the flag
        is all-reduced (MAX, one int32) here. ``step()`` then reads it (its one host sync).

        Args:
            optimizer: the optimizer whose gradients (``main_grad`` where set) are unscaled.

        Raises:
            RuntimeError: called twice for this optimizer, or after ``step()``, before update().
        """
        _check_optimizer(optimizer, "unscale_")
        if not self.is_enable():
            return
        grads = grads_of(self._applied(optimizer))
        if "_unscale" in vars(self) and _fleet.unscale_needs_no_collective(self):
            # fleet.distributed_scaler's _unscale adds only a found_inf all-reduce over the world to
            # Paddle's: the arithmetic runs here (the CUDA kernel's on a CPU), then that all-reduce
            found = _compat.unscale(self, optimizer, grads, own=True)
            found = agree_found_inf(found) if self._sync_found_inf else found
        else:
            found = self._agree(_compat.unscale(self, optimizer, grads), optimizer, unscaled=True)
        _compat.set_found_flags(self, found=found)
        self._found_by_opt[id(optimizer)] = found

    def _agree(self, found: Any, optimizer: Any, unscaled: bool = False) -> Any:
        """found_inf (a device flag or a Python number) as every rank sees it: the one place the
        skip decision is reduced across ranks (:func:`~paddle_amp_ext.distributed.agree_found_inf`:
        one MAX all-reduce over the world; none in a single process, nor where the gradients were
        reduced before the step, nor after an ``_unscale`` fleet replaced by one that reduces), for
        the scaler and for ``guard_optimizer``."""
        if not self._sync_found_inf:
            return found
        return agree_found_inf(found, optimizer, scaler=self if unscaled else None)

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
        _check_optimizer(optimizer, "step")
        return self._step(optimizer, parameters, resolve_clip(grad_clip), None)[0]

    def _step(self, optimizer: Any, parameters: Optional[Iterable[paddle.Tensor]], clip: Any,
              minimize: Optional[Tuple[tuple, dict]]) -> Tuple[StepResult, Any]:
        """One optimizer step, for ``step()`` and ``minimize()`` alike: the skip decision, the
        clip, the update (``optimizer.minimize(*args, **kwargs)`` when ``minimize`` holds the
        arguments, else :meth:`_apply_step`), the learning rate and the StepResult.

        Returns:
            (the StepResult, what ``optimizer.minimize`` returned, or None).
        """
        enabled = self.is_enable()
        layout = layout_of(optimizer)
        in_step = layout.clips_in_step  # fleet reduces the gradients in step()
        rides = minimize is None and (in_step or (layout.norm_is_global and clip is None))  # auto-parallel: own clip
        needs_params = (parameters is not None or clip is not None or self.record_grad_norm or not enabled
                        or (rides and in_step))
        judged: List[Pair] = self._applied(optimizer) if needs_params else []  # off the plain path
        pairs = judged if parameters is None else self._applied(optimizer, _parameters_of(optimizer, parameters))
        scale_used = self._policy.scale if enabled else 1.0
        norm = out = None
        if rides and self._rides_on_norm(optimizer, clip, parameters, judged, in_step):
            norm, skipped = self._step_on_norm(optimizer, clip, judged)
        elif not (skipped := self._skip(optimizer) if enabled else self._enter_plain_step(optimizer)):
            if clip is not None and not in_step:
                norm = clip_grads_(pairs, clip)
            if not enabled and self._skip_nonfinite:
                reuse = norm if _covers_every_grad(pairs, judged, clip) else None
                skipped, judged_norm = self._nonfinite(optimizer, judged, reuse, layout.norm_is_global)
                if norm is None:  # else the clip's norm (of the gradients it clipped) is the one reported
                    norm = None if in_step else judged_norm  # before fleet's reduce: not the global norm
            elif norm is None and self.record_grad_norm and not in_step:
                norm = global_norm(grads_of(pairs))
            if not skipped:
                token = _APPLYING.set(True)  # a routed optimizer guard defers to this decision
                try:
                    if minimize is not None:
                        out = optimizer.minimize(*minimize[0], **minimize[1])
                    else:
                        stepped_norm = self._apply_step(optimizer, in_step, clip, parameters)
                        if in_step:  # the clip ran where fleet runs its own: the global norm
                            norm = stepped_norm
                finally:
                    _APPLYING.reset(token)
        if enabled:
            _compat.mark_stepped(self, optimizer)
            if not self._policy.dynamic:
                _compat.reset_optimizer_stages(self)
        self._close_step(optimizer, skipped)
        self._last_result = StepResult(skipped=skipped, loss_scale=scale_used, grad_norm=norm)
        return self._last_result, out

    def _rides_on_norm(self, optimizer: Any, clip: Any, parameters: Any, judged: List[Pair], in_step: bool) -> bool:
        """Whether the skip decision can ride on the clip's reduced global norm instead of a found_inf
        all-reduce: the norm covers every gradient
        (:func:`~paddle_amp_ext.distributed.norm_covers_every_grad`; an inf/nan gradient on any rank
        leaves it inf/nan on every rank). With loss scaling off, for the non-finite guard (under
        fleet, or auto-parallel's own clip); with it on, under fleet only (the clip inside the
        step), on gradients not unscaled yet (no ``unscale_()`` by hand, whose flag is agreed
        already) that need no collective of fleet's to unscale
        (:func:`~paddle_amp_ext._compat.fleet.unscale_needs_no_collective`)."""
        if self.is_enable():
            ready = (in_step and _compat.optimizer_stage(self, optimizer) == "INIT"
                     and _fleet.unscale_needs_no_collective(self))
        else:
            ready = self._skip_nonfinite
        return ready and self._sync_found_inf and norm_covers_every_grad(
            optimizer, clip, parameters, [param for param, _ in judged])

    def _step_on_norm(self, optimizer: Any, clip: Any, judged: List[Pair]) -> Tuple[Optional[paddle.Tensor], bool]:
        """Unscale this rank's gradients (loss scaling on; no collective, no host read), then step
        through :func:`~paddle_amp_ext.distributed.step_unless_nonfinite`: the decision is whether
        the clip's reduced global norm is finite (one host read), the same on every rank.

        Returns:
            (the global norm, whether the step was skipped).
        """
        if self.is_enable():
            _compat.unscale(self, optimizer, grads_of(judged), own=True)
        else:
            self._enter_plain_step(optimizer)
        token = _APPLYING.set(True)  # a routed optimizer guard defers to this decision
        try:
            norm, skipped = step_unless_nonfinite(optimizer, clip)  # no found_inf all-reduce
        finally:
            _APPLYING.reset(token)
        if self.is_enable() and norm is not None:  # the agreed flag, where unscale_() leaves it
            _compat.set_found_flags(self, found=paddle.logical_not(paddle.isfinite(norm)))
        return norm, skipped

    def _enter_plain_step(self, optimizer: Any) -> bool:
        """The misuse check Paddle's stage machine makes, kept while loss scaling is off."""
        if id(optimizer) in self._plain_stepped:
            raise RuntimeError(
                "step() has already been called on this optimizer since the last update(): "
                "call scaler.update() once per iteration, after every optimizer's step()."
            )
        self._plain_stepped.add(id(optimizer))
        return False

    def _apply_step(self, optimizer: Any, in_step: bool, clip: Any,
                    parameters: Optional[Iterable[paddle.Tensor]]) -> Optional[paddle.Tensor]:
        """Apply the update; return the global norm where fleet's step clipped (``in_step``).

        The optimizer guard applies the call it intercepted instead.
        """
        if in_step:  # the clip runs where fleet runs its own
            return step_clipped(optimizer, clip, self.record_grad_norm, parameters)
        optimizer.step()
        return None

    def _nonfinite(self, optimizer: Any, judged: List[Pair], norm: Optional[paddle.Tensor],
                   norm_is_global: bool = False) -> Tuple[bool, Optional[paddle.Tensor]]:
        """(whether any rank's gradient is inf/nan, the norm it was judged by): one fused norm
        per gradient the step applies (``judged``), the flag agreed over the ranks (one
        collective when distributed, also by a rank without gradients; none where the norm is
        already the same on every rank: ``norm_is_global``, see
        :class:`~paddle_amp_ext.distributed.Layout`) and one host read; ``norm``, a clip's norm
        of the same gradients, is reused."""
        if norm is None:
            norm = global_norm(grads_of(judged))
        found = paddle.to_tensor([False]) if norm is None else paddle.logical_not(paddle.isfinite(norm))
        return host_bool(found if norm_is_global else self._agree(found, optimizer)), norm

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
        ``(None, None)``. Costs what ``step()`` costs: one device-to-host read of found_inf.
        In a static program this is Paddle's ``minimize`` (which needs an optimizer from
        ``paddle.static.amp.decorate``). One host sync (the skip decision), as ``step()``.

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
        _check_optimizer(optimizer, "minimize")
        result, out = self._step(optimizer, None, None, (args, kwargs))
        self.update()
        return (None, None) if result.skipped else out

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
    def loss_scale(self) -> float:
        """The scale the next ``scale()`` applies (host float, no sync).

        1.0 while loss scaling is off: ``enable=False``, the CPU outside ``fp16_emulation``, or a
        bfloat16/float32 run. ``state_dict()["scale"]`` always holds the configured scale.
        """
        return self._policy.scale if self.is_enable() else 1.0

    @property
    def skipped_steps(self) -> int:
        return self._policy.skipped_steps

    @property
    def consecutive_skips(self) -> int:
        return self._policy.consecutive_skips

    @property
    def last_step_skipped(self) -> bool:
        return self._last_skipped

    @property
    def last_result(self) -> Optional[StepResult]:
        """The StepResult of the most recent ``step()``/``minimize()`` (None before the first)."""
        return self._last_result

    @property
    def hooks(self) -> tuple:
        return tuple(self._hooks)

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """Set the loss scale now, as Paddle's method does, within the scaler's bounds.

        Args:
            new_init_loss_scaling: the new scale (> 0, within ``[min_loss_scaling, max_loss_scaling]``).

        Raises:
            TypeError: not a number.
            ValueError: not finite, not > 0, or outside the bounds.
        """
        validate_scaling(init_loss_scaling=new_init_loss_scaling, incr_ratio=self._policy.incr_ratio,
                         decr_ratio=self._policy.decr_ratio, incr_every_n_steps=self._policy.incr_every_n_steps,
                         decr_every_n_nan_or_inf=self._policy.decr_every_n_nan_or_inf,
                         min_loss_scaling=self._policy.min_scale, max_loss_scaling=self._policy.max_scale)
        self._policy.scale = self._init_scale = float(new_init_loss_scaling)
        _compat.set_scaler_scale(self, self._policy.scale)
        self._set_active(self._enable)

    def state_dict(self) -> dict:  # type: ignore[override]
        """Versioned state: Paddle's keys (``scale`` as a float32 array) plus bounds and counters.

        Never empty, also while loss scaling is off (Paddle's is ``{}`` then).

        Returns:
            A dict for ``paddle.save``, loadable by :meth:`load_state_dict`.
        """
        return self._policy.export_state()

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        """Load our state dict or one from ``paddle.amp.GradScaler.state_dict()``.

        Every value is validated as the constructor's are (a scale of 0, NaN or -5 is refused).

        Args:
            state_dict: from :meth:`state_dict` or from Paddle's scaler.

        Raises:
            RuntimeError: an empty dict (saved from a disabled Paddle scaler).
            ValueError: a state dict from a newer paddle-amp-ext, or a bad value (named).
        """
        self._policy.import_state(state_dict)
        self._init_scale = self._policy.scale  # as Paddle: the loaded scale becomes the initial one
        _compat.set_scaler_scale(self, self._policy.scale)
        self._set_active(self._enable)

    # Paddle's get_/set_ methods read and write these names: route them to the policy.
    def _policy_attr(name: str):  # noqa: N805 - descriptor factory used in the class body
        def get(self):
            return getattr(self._policy, name)

        def put(self, value):
            setattr(self._policy, name, value)

        return property(get, put)

    _incr_ratio = _policy_attr("incr_ratio")
    _decr_ratio = _policy_attr("decr_ratio")
    _incr_every_n_steps = _policy_attr("incr_every_n_steps")
    _decr_every_n_nan_or_inf = _policy_attr("decr_every_n_nan_or_inf")
    _incr_count = _policy_attr("incr_count")
    _decr_count = _policy_attr("decr_count")
    del _policy_attr
