"""``python -m paddle_amp_ext.doctor SCRIPT [ARGS]``: run a training script, stop at the first overflow.

Every leaf layer call and every functional op of :mod:`.ops` (``paddle.matmul`` in attention,
``F.linear``, ``@``) is checked while the script runs (``paddle.nn.Layer.__call__`` and those
entry points are wrapped for the duration of the run, in this process only): the forward output,
and through tensor hooks the gradient the backward produces. Each check reads one value back to the host,
so this is a diagnostic run, not a training run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Union

import numpy as np
import paddle

from .. import _state
from ..run._scripting import ScriptEnd, check_script, run_as_main
from . import ops
from .doctor import LIMITS, Finding, OverflowReport, peak_abs


class _OverflowFoundError(BaseException):
    """The doctor's stop signal. A BaseException, like KeyboardInterrupt, so that a script's own
    ``except Exception`` around its training step cannot swallow it."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.layer)
        self.finding = finding


class _ScriptWatch:
    """Checks every leaf layer call and every functional op (:mod:`.ops`) of a running script
    (a host read per check: diagnostic only); an op is named with the innermost layer it ran in."""

    def __init__(self, limit: float, loss_scale: float) -> None:
        self.limit, self.loss_scale = limit, loss_scale
        self.names: dict = {}
        self.pending: Optional[Finding] = None
        self.calls = 0
        self._depth = 0
        self._running: List[Any] = []  # the layers running now, outermost first

    def _name(self, layer: Any) -> str:
        return self.names.get(id(layer)) or f"{layer.full_name()}"

    def _check(self, layer: Any, direction: str, value: paddle.Tensor, factor: float,
               op: Optional[str] = None) -> Optional[Finding]:
        raw = float(peak_abs(value).numpy().reshape(-1)[0])
        peak = raw * factor
        if np.isfinite(peak) and peak <= self.limit:
            return None
        plain = not np.isfinite(raw) and _state.emulated_dtype() is None  # inf/nan in float32: no AMP involved
        return Finding.of(self._name(layer), layer, direction, raw if plain else peak, op, in_float32=plain)

    def on_op(self, op: str, out: Any) -> None:
        """A functional op ran: check its output now, its gradient in the backward pass."""
        if not self._running or not isinstance(out, paddle.Tensor) or not out.is_floating_point() or out.size == 0:
            return
        layer = self._running[-1]
        found = self._check(layer, "forward", out, 1.0, op)
        if found is not None:
            raise _OverflowFoundError(found)
        if not out.stop_gradient:
            out.register_hook(lambda g, lay=layer, o=op: self._on_grad(lay, g, o))

    def wrap(self, original: Callable) -> Callable:
        watch = self

        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            if watch.pending is not None:
                raise _OverflowFoundError(watch.pending)
            if watch._depth == 0 and id(layer) not in watch.names:
                for qual, sub in layer.named_sublayers(include_self=True):
                    watch.names.setdefault(id(sub), qual or type(sub).__name__)
            watch._depth += 1
            watch._running.append(layer)
            try:
                output = original(layer, *args, **kwargs)
            finally:
                watch._depth -= 1
                watch._running.pop()
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

    def _on_grad(self, layer: Any, grad: paddle.Tensor, op: Optional[str] = None) -> None:
        if self.pending is None:
            self.pending = self._check(layer, "backward", grad, self.loss_scale, op)


@dataclass(frozen=True)
class ScriptRun:
    """How a doctored script ended.

    Attributes:
        report: what the doctor found (empty when every watched value fit).
        exit_code: the script's own exit code (``sys.exit(n)``; 0 when it returned normally,
            1 when it raised), None when the doctor stopped it at an overflow.
        error: the exception the script raised (not SystemExit), or None.
        exit_message: what Python prints for the script's ``sys.exit(obj)`` (see
            :class:`~paddle_amp_ext.run._scripting.ScriptEnd`), or None.
    """

    report: OverflowReport
    exit_code: Optional[int]
    error: Optional[BaseException] = None
    exit_message: Optional[str] = None


def run_script(path: str, argv: List[str], dtype: str = "float16", loss_scale: float = 1.0) -> ScriptRun:
    """Run a training script as ``python path argv...`` would, every leaf layer call checked.

    Stops at the first forward or backward value beyond ``dtype``'s range. However the script
    ends (returning, ``sys.exit(n)``, an exception, or the doctor's stop), the overflow seen so
    far is reported, a backward one found in its last step included.

    Raises:
        FileNotFoundError: ``path`` is not a file.
    """
    check_script(path)
    watch = _ScriptWatch(LIMITS[dtype], loss_scale)
    original = paddle.nn.Layer.__call__
    paddle.nn.Layer.__call__ = watch.wrap(original)
    ops.acquire()
    end: Optional[ScriptEnd] = None
    try:
        with ops.observe(watch.on_op):
            end = run_as_main(path, argv)
    except _OverflowFoundError as stop:
        watch.pending = stop.finding
    finally:
        ops.release()
        paddle.nn.Layer.__call__ = original
    found = (watch.pending,) if watch.pending is not None else ()
    report = OverflowReport(dtype, LIMITS[dtype], found)
    if end is None:
        return ScriptRun(report, None)
    return ScriptRun(report, end.exit_code, end.error, end.exit_message)


class _Captured(BaseException):
    def __init__(self, layer: Any, args: tuple, kwargs: dict) -> None:
        super().__init__("captured")
        self.call = (layer, args, kwargs)


def capture_first_call(path: str, argv: List[str]) -> Union[tuple, ScriptEnd]:
    """Run a script until its first top-level layer call; return (model, args, kwargs), or how
    the script ended (its error or exit) when it ends without calling a layer. The script
    stops there.

    Raises:
        FileNotFoundError: ``path`` is not a file.
    """
    check_script(path)
    original = paddle.nn.Layer.__call__

    def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
        raise _Captured(layer, args, kwargs)

    paddle.nn.Layer.__call__ = __call__
    try:
        return run_as_main(path, argv)
    except _Captured as captured:
        return captured.call
    finally:
        paddle.nn.Layer.__call__ = original
