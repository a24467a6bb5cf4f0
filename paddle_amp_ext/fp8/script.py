"""Run a training script with FP8 rehearsed: the doctor's ``--fp8 RECIPE`` mode.

Every model the script calls at the top level (not from inside another layer's call) has its
``nn.Linear`` layers switched to FP8 linears (:func:`~paddle_amp_ext.fp8.linear.fp8_linears`)
for the rest of the script, all recording into one :class:`~paddle_amp_ext.fp8.stats.Fp8Stats`;
on Paddle 3.x Paddle's FP8 kernels are emulated too (:func:`~paddle_amp_ext.fp8.emulation.fp8_emulation`),
so a PaddleFormers FP8 model runs on a CPU. A top-level call of a model already called since
the last step starts the next step of the stats (model, loss, model: the second model call).
Paddle 2.6 has no FP8 dtypes: there only the linears are rehearsed, and
:attr:`Fp8ScriptRun.notes` says so.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Union

import paddle

from ..run._scripting import check_script, run_as_main
from .emulation import fp8_emulation
from .linear import Fp8Recipe, fp8_linears
from .stats import Fp8Stats

NO_FP8_DTYPES = ("Paddle {version} has no FP8 dtypes (paddle.float8_e4m3fn arrived in Paddle 3.0): Paddle's FP8 "
                 "kernels are not emulated; the nn.Linear layers run as FP8 linears")


@dataclass(frozen=True)
class Fp8ScriptRun:
    """How a script ran with FP8 rehearsed.

    Attributes:
        stats: what each FP8 linear's quantizations lost.
        exit_code: the script's exit code, as ``python script.py`` would exit.
        error: the exception the script raised, or None.
        exit_message: what ``sys.exit(obj)`` printed, or None.
        models: how many top-level models were switched to FP8 linears.
        notes: what the report should say besides (e.g. Paddle 2.6 emulates no FP8 kernel).
    """

    stats: Fp8Stats
    exit_code: int
    error: Optional[BaseException]
    exit_message: Optional[str]
    models: int
    notes: List[str]


class _Switcher:
    """Switches each model called at the top level to FP8 linears, once, for the script's length."""

    def __init__(self, recipe: Fp8Recipe, stats: Fp8Stats, exclude: Sequence[str], stack: contextlib.ExitStack):
        self.recipe, self.stats, self.exclude, self.stack = recipe, stats, tuple(exclude), stack
        self.switched: List[Any] = []
        self.this_step: List[Any] = []
        self.local = threading.local()

    def wrap(self, original: Callable) -> Callable:
        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            depth = getattr(self.local, "depth", 0)
            if depth == 0:
                self._top_level(layer)
            self.local.depth = depth + 1
            try:
                return original(layer, *args, **kwargs)
            finally:
                self.local.depth = depth

        return __call__

    def _top_level(self, layer: Any) -> None:
        if any(seen is layer for seen in self.this_step):
            self.stats.next_step()
            self.this_step.clear()
        self.this_step.append(layer)
        if any(seen is layer for seen in self.switched):
            return
        names = {name or type(layer).__name__ for name, sub in layer.named_sublayers(include_self=True)
                 if isinstance(sub, paddle.nn.Linear)}
        self.stack.enter_context(fp8_linears(layer, self.recipe, exclude=[n for n in self.exclude if n in names],
                                             stats=self.stats))
        self.switched.append(layer)


def run_script_fp8(path: str, argv: List[str], recipe: Union[Fp8Recipe, str] = "blockwise",
                   exclude: Sequence[str] = ()) -> Fp8ScriptRun:
    """Run ``python path argv...`` with FP8 rehearsed (see the module docstring).

    Args:
        path: the script.
        argv: its arguments.
        recipe: an :class:`Fp8Recipe` or ``"blockwise"``/``"current"``/``"delayed"``.
        exclude: layer names kept out of FP8 (``fp8_exclude_layers``), in whichever model has them.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ValueError, TypeError: ``recipe`` is not a recipe.
    """
    recipe = Fp8Recipe.of(recipe)
    check_script(path)
    stats = Fp8Stats()
    notes: List[str] = []
    original = paddle.nn.Layer.__call__
    with contextlib.ExitStack() as stack:
        if hasattr(paddle, "float8_e4m3fn"):
            stack.enter_context(fp8_emulation())
        else:
            notes.append(NO_FP8_DTYPES.format(version=paddle.__version__))
        switcher = _Switcher(recipe, stats, exclude, stack)
        paddle.nn.Layer.__call__ = switcher.wrap(original)
        try:
            end = run_as_main(path, argv)
        finally:
            paddle.nn.Layer.__call__ = original
    return Fp8ScriptRun(stats, end.exit_code, end.error, end.exit_message, len(switcher.switched), notes)
