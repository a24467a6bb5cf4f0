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
of ours runs on them. Under auto-dp (``dist.enable_auto_dp()``) each rank's gradient is its own
addend until the step: the clip runs inside the step and the decision rides on its norm, or the
flag is reduced once. The decision per layout: :mod:`paddle_amp_ext.distributed.skip`; the step
path itself: :mod:`paddle_amp_ext.scaler_step`; ``update()`` and the hooks:
:mod:`paddle_amp_ext.scaler_hooks`.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Union

import paddle
from paddle.amp.grad_scaler import GradScaler as PaddleGradScaler  # not paddle.amp's: routing replaces it

from . import _compat, _state
from ._log import info_once, warn_once
from .config import FLOAT32_MAX, AmpConfig, validate_scaling
from .device import current_decision
from .events import StepResult
from .lossscale import DynamicLossScale
from .scaler_hooks import Reports
from .scaler_step import StepPath, applying

__all__ = ["GradScaler", "applying"]

_SCALER_DEFAULTS = dict(init_loss_scaling=2.0**16, incr_ratio=2.0, decr_ratio=0.5, incr_every_n_steps=2000,
                       decr_every_n_nan_or_inf=1, use_dynamic_loss_scaling=True, min_loss_scaling=1.0,
                       max_loss_scaling=FLOAT32_MAX, hysteresis="consecutive", max_consecutive_skips=None,
                       on_collapse="warn")


class GradScaler(StepPath, Reports, PaddleGradScaler):
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
