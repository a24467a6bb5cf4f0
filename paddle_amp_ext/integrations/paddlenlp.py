"""PaddleFormers' or PaddleNLP's ``Trainer`` with this package: the AMP tags next to the Trainer's own VisualDL logs.

Three lines (the Trainer builds ``paddle.amp.GradScaler`` in its constructor and binds
``paddle.amp.auto_cast`` when its ``trainer`` module is imported, so route first)::

    import paddle_amp_ext as amp
    amp.route()                                              # before importing paddleformers.trainer
    trainer = Trainer(..., callbacks=[AmpCallback()])        # from paddle_amp_ext.integrations.paddlenlp

The Trainer reads ``_cache_found_inf`` / ``_cache_founf_inf`` right after ``scaler.step()`` to
decide whether the optimizer ran (and so whether to step the LR scheduler); this package's
scaler sets them after every step, so every skipped step is seen.

PaddleFormers (the successor, Paddle 3) and PaddleNLP share the callback interface: the
callback is a ``TrainerCallback`` of whichever is installed (the one already imported when both
are, else PaddleFormers). Importing this module imports that toolkit's ``trainer`` module; the
package never imports this module itself.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional

from .._log import warn_once
from ..scaler import GradScaler

#: The toolkits whose ``trainer.TrainerCallback`` the callback can be, in order of preference.
TOOLKITS = ("paddleformers", "paddlenlp")


def _trainer_callback_class() -> type:
    """``TrainerCallback`` of the toolkit already imported, else of the first one that imports."""
    order = sorted(TOOLKITS, key=lambda name: name not in sys.modules)  # stable: preference kept within each group
    errors = []
    for name in order:
        try:
            return importlib.import_module(f"{name}.trainer").TrainerCallback
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("paddle_amp_ext.integrations.paddlenlp needs PaddleFormers or PaddleNLP: "
                      "pip install paddleformers (Paddle 3) or paddlenlp. " + "; ".join(errors))


TrainerCallback = _trainer_callback_class()


class AmpCallback(TrainerCallback):
    """Attach a :class:`paddle_amp_ext.VisualDLHook` to the Trainer's scaler.

    Args:
        logdir: where the hook writes its run directory; default the Trainer's
            ``args.logging_dir`` (beside the Trainer's own VisualDL records).
        flush_every: the hook's ``flush_every``.
    """

    def __init__(self, logdir: Optional[str] = None, flush_every: int = 50) -> None:
        self.logdir, self.flush_every = logdir, flush_every
        self.hook: Any = None
        self._scaler: Any = None

    def on_optimizer_begin(self, args: Any, state: Any, control: Any, scaler: Any = None, **kwargs: Any) -> None:
        if scaler is None or scaler is self._scaler:
            return
        if not isinstance(scaler, GradScaler):
            warn_once("paddlenlp:not-routed", "AmpCallback: the Trainer's scaler is Paddle's %s, so no AMP tags are "
                      "logged: call paddle_amp_ext.route() before importing the Trainer (paddleformers.trainer "
                      "or paddlenlp.trainer).", type(scaler).__name__)
            return
        from ..visualdl import VisualDLHook

        if self.hook is not None:
            self.hook.close()
        self._scaler = scaler
        self.hook = scaler.add_hook(VisualDLHook(self.logdir or args.logging_dir, flush_every=self.flush_every))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hook is not None:
            self.hook.close()
            self._scaler.remove_hook(self.hook)
            self.hook = self._scaler = None
