"""How a routing's :class:`AmpConfig` applies to the calls of code you do not own.

One rule for every key: a key the config sets (:attr:`AmpConfig.given`: the keys of the file it
was read from, else those not at their default) is applied, replacing what the caller passes
(logged once at WARNING where the caller passed another value); any other key leaves the caller's
argument alone. So the file ``doctor --advise`` writes (its proposal: dtype, ``fp32_layers``,
the initial loss scale) changes exactly what the advisor proposed. Op lists are merged (the
config's ops join the caller's); ``fp32_layers`` are kept in float32
(:func:`paddle_amp_ext.keep_fp32`) in the models given to ``decorate``, and in the layer of the
first top-level layer call (the model ``doctor --advise`` measured).

Example:
    >>> config = AmpConfig(init_loss_scaling=1024.0)
    >>> scaler_kwargs(config, (), {"init_loss_scaling": 128.0})["init_loss_scaling"]
    1024.0
"""

from __future__ import annotations

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
    """Keeps ``names`` in float32 in the layer of the first top-level layer call, then stands aside.

    ``install()`` wraps ``paddle.nn.Layer.__call__`` (in this process); after the first call the
    wrapper only forwards, and ``uninstall()`` puts the original back where nothing wrapped it since.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.done = False
        self._original: Any = None
        self._wrapper: Any = None

    def install(self) -> None:
        original = self._original = paddle.nn.Layer.__call__
        first = self

        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            if not first.done:
                first.done = True
                keep_layers(first.names, [layer])
            return original(layer, *args, **kwargs)

        self._wrapper = paddle.nn.Layer.__call__ = __call__

    def uninstall(self) -> None:
        self.done = True
        if self._wrapper is not None and paddle.nn.Layer.__call__ is self._wrapper:
            paddle.nn.Layer.__call__ = self._original
        self._wrapper = None
