"""Where ``fp16_emulation(model)`` rounds: inside the forwards of ``model`` and its sublayers.

:func:`model_scope` records the code objects of the layers' ``forward`` functions (through any
decorators, ``functools.wraps``-style) and the layers themselves;
:func:`paddle_amp_ext._state.in_scope` is true while one of those layers' ``forward`` is on the
caller's stack. No layer hooks: a Paddle layer with a forward hook leaves Paddle's fast call path
(about 10 us per call on 3.3.1), and a forward that raised leaves nothing behind (its frame is
gone). Backward needs no scope: it is rounded where the forward rounded (the rounding nodes are
in the graph). Checked on Paddle 2.6.2 and 3.3.1.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Set

import paddle

from .. import _state


def _codes(layer: paddle.nn.Layer) -> Set[Any]:
    """The code objects a call of ``layer.forward`` runs as the layer's own method: the function
    itself and every function it wraps (``__wrapped__``)."""
    function = getattr(layer.forward, "__func__", layer.forward)
    codes = set()
    seen = 0
    while function is not None and seen < 16:
        code = getattr(function, "__code__", None)
        if code is not None:
            codes.add(code)
        function = getattr(function, "__wrapped__", None)
        seen += 1
    return codes


@contextlib.contextmanager
def model_scope(model: paddle.nn.Layer) -> Iterator[None]:
    """Round inside the forwards of ``model`` and its sublayers (also a sublayer called on its
    own) while the block runs; the layers are the ones ``model`` has when it is entered."""
    layers = model.sublayers(include_self=True)
    codes = set().union(*(_codes(layer) for layer in layers))
    token = _state.push_scope(_state.Scope(frozenset(codes), frozenset(id(layer) for layer in layers)))
    try:
        yield
    finally:
        _state.pop_scope(token)
