"""How a routing's :class:`AmpConfig` applies to the calls of code you do not own.

One rule for every key: a key the config sets (:attr:`AmpConfig.given`: the keys of the file it
was read from, else those not at their default) is applied, replacing what the caller passes
(logged once at WARNING where the caller passed another value); any other key leaves the caller's
argument alone. So the file ``doctor --advise`` writes (its proposal: dtype, ``fp32_layers``,
the initial loss scale) changes exactly what the advisor proposed. Op lists are merged (the
config's ops join the caller's); ``fp32_layers`` are kept in float32
(:func:`paddle_amp_ext.keep_fp32`) in the models given to ``decorate``, else in the first called
layer that has them all (the model ``doctor --advise`` measured; a preprocessing layer called
before it is passed by), with a warning at the routing's end when no layer had them.

Example:
    >>> config = AmpConfig(init_loss_scaling=1024.0)
    >>> scaler_kwargs(config, (), {"init_loss_scaling": 128.0})["init_loss_scaling"]
    1024.0
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence

import paddle

from .._log import warn_once
from ..config import AmpConfig
from ..keep import keep_fp32, select_layers

#: Paddle's positional parameters, in order: ``GradScaler``/``AmpScaler``, ``auto_cast``, ``decorate``.
SCALER_PARAMS = ("enable", "init_loss_scaling", "incr_ratio", "decr_ratio", "incr_every_n_steps",
                 "decr_every_n_nan_or_inf", "use_dynamic_loss_scaling")
CAST_PARAMS = ("enable", "custom_white_list", "custom_black_list", "level", "dtype", "use_promote")
DECORATE_PARAMS = ("models", "optimizers", "level", "dtype", "master_weight", "save_dtype", "master_grad",
                   "excluded_layers")
#: The AmpConfig keys each call takes (the rest of the scaler's are this package's keyword extras).
SCALER_KEYS = SCALER_PARAMS + ("min_loss_scaling", "max_loss_scaling", "hysteresis", "max_consecutive_skips",
                               "on_collapse")
CAST_KEYS = ("enable", "level", "dtype")
DECORATE_KEYS = ("level", "dtype")
LIST_KEYS = ("custom_white_list", "custom_black_list")


def chosen(config: Optional[AmpConfig]) -> Dict[str, Any]:
    """The keys ``config`` sets (:attr:`AmpConfig.given`), with their values."""
    return {} if config is None else {key: getattr(config, key) for key in sorted(config.given)}


def _apply(call: str, config: Optional[AmpConfig], keys: Sequence[str], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    for key, value in chosen(config).items():
        if key not in keys:
            continue
        if key in kwargs and kwargs[key] != value:
            warn_once(f"routing:{call}:{key}:{value!r}:{kwargs[key]!r}",
                      "The AMP config's %s=%r replaces the %s=%r passed to paddle.amp.%s.", key, value, key,
                      kwargs[key], call)
        kwargs[key] = value
    return kwargs


def _named(params: Sequence[str], args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Positional arguments moved into ``kwargs`` by ``params``' names."""
    if len(args) > len(params):
        raise TypeError(f"takes at most {len(params)} positional arguments ({len(args)} given)")
    named = dict(zip(params, args))
    twice = sorted(set(named) & set(kwargs))
    if twice:
        raise TypeError(f"got multiple values for argument {twice[0]!r}")
    named.update(kwargs)
    return named


def scaler_kwargs(config: Optional[AmpConfig], args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """A ``GradScaler``/``AmpScaler`` call's arguments, all by name, with the config applied."""
    return _apply("GradScaler", config, SCALER_KEYS, _named(SCALER_PARAMS, args, kwargs))


def cast_kwargs(config: Optional[AmpConfig], args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """An ``auto_cast`` call's arguments, all by name, with the config applied (op lists merged)."""
    kwargs = _apply("auto_cast", config, CAST_KEYS, _named(CAST_PARAMS, args, kwargs))
    for key, ops in chosen(config).items():
        if key in LIST_KEYS:
            given = list(kwargs.get(key) or ())
            kwargs[key] = given + [op for op in ops if op not in given]
    return kwargs


def decorate_kwargs(config: Optional[AmpConfig], args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """A ``decorate`` call's arguments, all by name, with the config applied (``fp32_layers`` kept
    in float32 in its models first, so that O2 leaves them in float32)."""
    kwargs = _apply("decorate", config, DECORATE_KEYS, _named(DECORATE_PARAMS, args, kwargs))
    if config is not None and config.fp32_layers and "models" in kwargs:
        models = kwargs["models"]
        keep_layers(config.fp32_layers, models if isinstance(models, (list, tuple)) else [models])
    return kwargs


def keep_layers(names: Iterable[str], models: List[Any]) -> None:
    """Keep the sublayers ``names`` in float32, each in the models that have it.

    Raises:
        ValueError: a name that no model has, naming ``fp32_layers`` and the closest names.
    """
    models = [m for m in models if isinstance(m, paddle.nn.Layer)]
    for name in names:
        errors, hits = [], 0
        for model in models:
            try:
                select_layers(model, [name])
            except ValueError as exc:
                errors.append(str(exc))
                continue
            keep_fp32(model, [name])
            hits += 1
        if models and not hits:
            raise ValueError(f"The AMP config's fp32_layers names {name!r}, which the model does not have: "
                             f"{errors[0]} Fix fp32_layers (doctor --advise names sublayers of the script's "
                             "first model call).")


class FirstCall:
    """Keeps ``names`` in float32 in the first called layer that has them all, then stands aside.

    A preprocessing layer called before the model, which lacks those sublayers, is passed by
    (each layer is looked at once, at its first call); ``settle()`` ends the wait (the routing
    ended, or ``decorate`` named the models), with a warning when no layer had the names. Every
    waiting FirstCall shares one wrapper of ``paddle.nn.Layer.__call__`` (this process), put in
    at the first ``install()`` and taken out when the last waiting one settles, in any order and
    from any thread, unless something wrapped ``__call__`` since (the wrapper then only forwards).
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.done = False
        self.kept_in: Optional[str] = None  # the class of the layer the names were kept in
        self._miss: Optional[str] = None  # why the first called layer did not take them
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def install(self) -> None:
        with _LAYER_CALL_LOCK:
            if not _LAYER_CALL:
                original = paddle.nn.Layer.__call__
                _LAYER_CALL.update(original=original, wrapper=_wrap_layer_call(original))
                paddle.nn.Layer.__call__ = _LAYER_CALL["wrapper"]
            _WAITING.append(self)

    def offer(self, layer: Any) -> None:
        """A layer is being called: keep the names in it if it has them all (first time seen only)."""
        with self._lock:
            if self.done or layer in self._seen:
                return
            self._seen.add(layer)
            try:
                select_layers(layer, self.names)
            except ValueError as exc:
                self._miss = self._miss or f"{type(layer).__name__}: {exc}"
                return
            keep_fp32(layer, self.names)
            self.done, self.kept_in = True, type(layer).__name__
        self._leave()

    def settle(self, warn: bool = False) -> None:
        """Stop waiting; with ``warn``, log (once) when the names were kept in no layer."""
        with self._lock:
            missed, self.done = not self.done, True
        if warn and missed:
            why = f" (the first called layer, {self._miss})" if self._miss else " (the script called no layer)"
            warn_once(f"routing:fp32_layers:{self.names!r}", "The AMP config's fp32_layers %s were kept in float32 "
                      "in no model: no layer the script called has them all%s. Fix fp32_layers (doctor --advise "
                      "names sublayers of the script's first model call).", list(self.names), why)
        self._leave()

    def uninstall(self) -> None:
        """The routing ended: :meth:`settle` with a warning when the names were never kept."""
        self.settle(warn=True)

    def _leave(self) -> None:
        with _LAYER_CALL_LOCK:
            _WAITING[:] = [first for first in _WAITING if first is not self]
            if not _WAITING and _LAYER_CALL and paddle.nn.Layer.__call__ is _LAYER_CALL["wrapper"]:
                paddle.nn.Layer.__call__ = _LAYER_CALL["original"]
                _LAYER_CALL.clear()


_LAYER_CALL_LOCK = threading.Lock()
_LAYER_CALL: Dict[str, Any] = {}  # original / wrapper, while the wrapper is in paddle.nn.Layer.__call__
_WAITING: List[FirstCall] = []  # installed and not settled, oldest first


def _wrap_layer_call(original: Any) -> Any:
    def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
        for first in list(_WAITING):  # empty once every FirstCall settled: a list check per call
            first.offer(layer)
        return original(layer, *args, **kwargs)

    return __call__
