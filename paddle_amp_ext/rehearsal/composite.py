"""Functions that Paddle runs as several ops under different AMP rules on a GPU.

From reading Paddle's code (2.6.2 and 3.3.1; :mod:`paddle_amp_ext._compat.layers`):

- every convolution (``F.conv1d`` .. ``F.conv3d_transpose``, and ``_conv_nd`` behind
  ``nn.Conv2D``/``nn.Conv3D``) runs its conv kernel without the bias, then adds the bias
  (reshaped to the channel axis) as a separate ``add``: under O1 the fp16 conv output plus a
  float32 bias is a float32 add (mixed inputs promote), so the bias is never rounded and the
  sum is float32. The conv's op type is the one Paddle's GPU path picks (``depthwise_conv2d``
  for a depthwise kernel, which no default list names);
- ``F.linear`` is ``matmul`` then ``add`` on 2.6.2 (the same promotion for the bias), one fused
  ``linear_v2`` (bias included) on 3.3.1.

:func:`split` says how to run such a call: the main op's arguments without the bias, its op
types, and the bias with the axis it is added along.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from .._compat.layers import gpu_linear_is_fused

CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose",
                          "conv3d_transpose", "_conv_nd"})
_CHANNEL_FIRST = frozenset({"NCL", "NCHW", "NCDHW"})


class Split(NamedTuple):
    """A call run as its main op (``args``/``kwargs`` without the bias, ``op_types``) and then
    ``bias`` added along ``axis`` (``None``: no bias)."""

    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    op_types: Tuple[str, ...]
    bias: Any
    axis: int


_LINEAR_PARAMETERS = ("x", "weight", "bias", "name")


def linear_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any, Any]]:
    """``(x, weight, bias)`` of an ``F.linear(x, weight, bias=None, name=None)`` call, or None
    where the arguments do not bind (Paddle then raises its own error)."""
    if len(args) > len(_LINEAR_PARAMETERS):
        return None
    values = dict(zip(_LINEAR_PARAMETERS, args))
    for key, value in kwargs.items():
        if key not in _LINEAR_PARAMETERS or key in values:
            return None
        values[key] = value
    if "x" not in values or "weight" not in values:
        return None
    return values["x"], values["weight"], values.get("bias")


@functools.cache
def _signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


def _conv_op_type(name: str, x: Any, weight: Any, groups: int, axis: int) -> str:
    """The op type Paddle's GPU path runs for a convolution (``F.conv2d`` and ``nn.Conv2D``
    pick ``depthwise_conv2d`` when groups == input channels != 1 and the output channels are a
    multiple; the transposes ``depthwise_conv2d_transpose`` when each group has one filter)."""
    base = name.replace("conv1d", "conv2d")
    channels = x.shape[axis]
    if base == "conv2d" and channels == groups != 1 and weight.shape[0] % channels == 0:
        return "depthwise_conv2d"
    if name == "conv2d_transpose" and channels == groups != 1 and weight.shape[1] == 1:
        return "depthwise_conv2d_transpose"
    return base


def split(name: str, function: Callable, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Split]:
    """How the GPU runs ``function(*args, **kwargs)``, the entry point ``name``, if it is more
    than one op under AMP; None when it is one op (or the arguments do not bind)."""
    if name != "linear" and name not in CONVOLUTIONS:
        return None
    if name == "linear":
        if gpu_linear_is_fused():
            return None
        bound = linear_arguments(args, kwargs)  # no inspect binding: nn.Linear calls it every step
        if bound is None:
            return None
        x, weight, bias = bound
        return Split((x, weight), {}, ("matmul_v2",), bias, -1)
    try:
        bound = _signature(function).bind(*args, **kwargs)
    except TypeError:  # let Paddle raise its own error
        return None
    arguments = bound.arguments
    bias, x = arguments.get("bias"), arguments.get("x")
    if name == "linear":
        main = ("matmul_v2",)
        axis = -1
    elif name == "_conv_nd":
        axis = arguments.get("channel_dim", 1)
        main = (arguments.get("op_type", "conv2d"),)
    else:
        data_format = arguments.get("data_format", "NCHW")
        axis = 1 if data_format in _CHANNEL_FIRST else len(x.shape) - 1
        main = (_conv_op_type(name, x, arguments["weight"], arguments.get("groups", 1), axis),)
    if bias is not None:
        arguments["bias"] = None
    return Split(bound.args, bound.kwargs, main, bias, axis)


def along(bias: Any, ndim: int, axis: int) -> Any:
    """``bias`` (1-D) shaped to broadcast along ``axis`` of an ``ndim``-D output, as Paddle's
    conv functions reshape it."""
    axis = axis % ndim
    if axis == ndim - 1:
        return bias
    return bias.reshape([1] * axis + [-1] + [1] * (ndim - axis - 1))
