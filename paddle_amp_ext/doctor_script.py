"""``python -m paddle_amp_ext.doctor SCRIPT [ARGS]``: run a training script, stop at the first overflow.

Every leaf layer call is checked while the script runs (``paddle.nn.Layer.__call__`` is wrapped
for the duration of the run, in this process only): the forward output, and through tensor
hooks the gradient each layer's backward produces. Each check reads one value back to the host,
so this is a diagnostic run, not a training run.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np
import paddle

from .doctor import LIMITS, Finding, OverflowReport


class _OverflowFoundError(Exception):
    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.layer)
        self.finding = finding


class _ScriptWatch:
    """Checks every leaf layer call of a running script (a host read per call: diagnostic only)."""

    def __init__(self, limit: float, loss_scale: float) -> None:
        self.limit, self.loss_scale = limit, loss_scale
        self.names: dict = {}
        self.pending: Optional[Finding] = None
        self.calls = 0
        self._depth = 0

    def _name(self, layer: Any) -> str:
        return self.names.get(id(layer)) or f"{layer.full_name()}"

    def _check(self, layer: Any, direction: str, value: paddle.Tensor, factor: float) -> Optional[Finding]:
        peak = float(paddle.max(paddle.abs(value.detach().astype("float32"))).numpy().reshape(-1)[0]) * factor
        if np.isfinite(peak) and peak <= self.limit:
            return None
        return Finding.of(self._name(layer), layer, direction, peak)

    def wrap(self, original: Callable) -> Callable:
        watch = self

        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            if watch.pending is not None:
                raise _OverflowFoundError(watch.pending)
            if watch._depth == 0 and id(layer) not in watch.names:
                for qual, sub in layer.named_sublayers(include_self=True):
                    watch.names.setdefault(id(sub), qual or type(sub).__name__)
            watch._depth += 1
            try:
                output = original(layer, *args, **kwargs)
            finally:
                watch._depth -= 1
            if list(layer.children()):
                return output
            watch.calls += 1
            first = output[0] if isinstance(output, (list, tuple)) and output else output
            if isinstance(first, paddle.Tensor) and first.is_floating_point() and first.size > 0:
                found = watch._check(layer, "forward", first, 1.0)
                if found is not None:
                    raise _OverflowFoundError(found)
                for item in args:
                    if isinstance(item, paddle.Tensor) and not item.stop_gradient and item.is_floating_point():
                        item.register_hook(lambda g, lay=layer: watch._on_grad(lay, g))
            return output

        return __call__

    def _on_grad(self, layer: Any, grad: paddle.Tensor) -> None:
        if self.pending is None:
            self.pending = self._check(layer, "backward", grad, self.loss_scale)


def run_script(path: str, argv: List[str], dtype: str = "float16", loss_scale: float = 1.0) -> OverflowReport:
    """Run a training script with every leaf layer call checked; stop at the first overflow."""
    import runpy
    import sys

    watch = _ScriptWatch(LIMITS[dtype], loss_scale)
    original = paddle.nn.Layer.__call__
    old_argv = sys.argv
    paddle.nn.Layer.__call__ = watch.wrap(original)
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
    except _OverflowFoundError as stop:
        return OverflowReport(dtype, LIMITS[dtype], (stop.finding,))
    finally:
        paddle.nn.Layer.__call__ = original
        sys.argv = old_argv
    found = (watch.pending,) if watch.pending is not None else ()
    return OverflowReport(dtype, LIMITS[dtype], found)
