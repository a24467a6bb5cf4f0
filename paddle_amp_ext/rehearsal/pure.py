"""Parameters held in low precision for a layer's forward: white-listed layers and O2.

``decorate(level="O2")`` casts the parameters of every layer but the norms (and the excluded
ones) to fp16 on a GPU; where AMP cannot run it only marks those layers
(:func:`paddle_amp_ext._state.o2_dtype`). A rehearsal holds a marked layer's parameters as fp16
would: for the length of each forward its float32 parameters are swapped for rounded copies
marked low precision (:mod:`.lowprec`), so the ops inside follow Paddle's rules for fp16
inputs and their gradients are rounded as fp16 parameter gradients are. A ``decorate`` made
inside a rehearsal also rounds the parameters in place once, as the cast to fp16 does (the
optimizer's float32 master weights start from those values); with ``master_weight=False``
the parameters are rounded in place before every forward, as an optimizer updating fp16
parameters leaves them.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

import paddle

from .. import _compat, _state
from . import lowprec
from .rounding import round_trip, round_values


class WeightSwap:
    """A layer's own float32 parameters, rounded for the length of its forward (AMP casts them
    per op); the parameters come back after the forward, or at the latest at :meth:`leave_all`.
    A parameter another swap already replaced by a rounded copy is left to that swap."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.swapped: Dict[int, Tuple[paddle.nn.Layer, Dict[str, Any]]] = {}

    def enter(self, layer: paddle.nn.Layer) -> None:
        self.leave(layer)  # a forward that raised left its rounded weights behind
        params = layer._parameters  # noqa: SLF001 - Layer.__getattr__ reads parameters from here
        originals = {name: p for name, p in params.items()
                     if p is not None and p.dtype == paddle.float32 and not lowprec.is_low(p, self.dtype)}
        for name, param in originals.items():
            params[name] = lowprec.mark(round_trip(param, self.dtype), self.dtype)
        self.swapped[id(layer)] = (layer, originals)

    def leave(self, layer: paddle.nn.Layer) -> None:
        entry = self.swapped.pop(id(layer), None)
        if entry is not None:
            entry[0]._parameters.update(entry[1])  # noqa: SLF001

    def leave_all(self) -> None:
        for layer, _ in list(self.swapped.values()):
            self.leave(layer)


@paddle.no_grad()
def _round_in_place(layer: paddle.nn.Layer, dtype: str) -> None:
    for param in layer._parameters.values():  # noqa: SLF001
        if param is not None and param.dtype == paddle.float32:
            param.set_value(round_values(param, dtype))


class HeldParameters:
    """Forward hooks that hold marked layers' parameters in ``dtype`` while a rehearsal runs."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.swap = WeightSwap(dtype)
        self.handles: List[Any] = []
        self.layers: Dict[int, paddle.nn.Layer] = {}

    def hold(self, layers: Iterable[paddle.nn.Layer], round_now: bool = False) -> None:
        """Hold ``layers`` (those marked for this dtype); ``round_now``: round them in place
        once, as ``decorate`` casting them does."""
        for layer in layers:
            mark = _state.o2_dtype(layer)
            if mark is None or mark[0] != self.dtype or id(layer) in self.layers:
                continue
            self.layers[id(layer)] = layer
            if round_now or not mark[1]:
                _round_in_place(layer, self.dtype)
            self.handles.append(layer.register_forward_pre_hook(self._pre(mark[1])))
            self.handles.append(layer.register_forward_post_hook(self._post))

    def _pre(self, master_weight: bool) -> Any:
        def hook(layer: Any, inputs: Any) -> None:
            if _state.rehearsed_lists() is None or not _compat.runs_eagerly():
                return
            if not master_weight:  # the optimizer updated fp16 parameters: they hold fp16 values
                _round_in_place(layer, self.dtype)
            self.swap.enter(layer)
        return hook

    def _post(self, layer: Any, inputs: Any, output: Any) -> None:
        self.swap.leave(layer)

    def release(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.layers = [], {}
        self.swap.leave_all()
