"""Where ``fp16_emulation(model)`` rounds: inside the forwards of ``model`` and its sublayers.

Every layer of the model gets a forward pre-hook and post-hook that push and pop a marker in
:func:`paddle_amp_ext._state.forwards`; :func:`paddle_amp_ext._state.in_scope` is true while
one is running. Backward needs no marker: it is rounded where the forward rounded (the
rounding nodes are in the graph). Checked on Paddle 2.6.2 and 3.3.1, where a layer's hooks are
called from the frame of ``Layer.__call__``'s implementation.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import paddle

from .. import _state


@contextlib.contextmanager
def model_scope(model: paddle.nn.Layer) -> Iterator[None]:
    """Mark the forwards of ``model`` and its sublayers as rehearsed while they run.

    A pre-hook pushes the frame of Paddle's ``Layer.__call__`` running the layer, the post-hook
    pops it; a forward that raised leaves its frame behind, and the next call of a rehearsed
    layer drops every frame that is no longer running (not on the caller's stack).
    """
    def pre(layer: Any, inputs: Any) -> None:
        frame = sys._getframe(1)  # Layer.__call__'s frame for this call
        running = _state.forwards()
        if running and not _state.on_stack(running[-1], frame):
            running = tuple(f for f in running if _state.on_stack(f, frame))
        _state.set_forwards((*running, frame))

    def post(layer: Any, inputs: Any, output: Any) -> None:
        frame = sys._getframe(1)
        running = _state.forwards()
        if frame in running:
            running = running[:running.index(frame)]
        _state.set_forwards(running)

    handles = []
    for layer in model.sublayers(include_self=True):
        handles.append(layer.register_forward_pre_hook(pre))
        handles.append(layer.register_forward_post_hook(post))
    outer = _state.forwards()
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        _state.set_forwards(outer)
