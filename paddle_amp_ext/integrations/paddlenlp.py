"""PaddleNLP's ``Trainer`` with this package: the AMP tags next to the Trainer's own VisualDL logs.

Three lines (the Trainer builds ``paddle.amp.GradScaler`` in its constructor and binds
``paddle.amp.auto_cast`` when ``paddlenlp.trainer`` is imported, so route first)::

    import paddle_amp_ext as amp
    amp.route()                                              # before importing paddlenlp.trainer
    trainer = Trainer(..., callbacks=[AmpCallback()])        # from paddle_amp_ext.integrations.paddlenlp

The Trainer reads ``_cache_found_inf`` / ``_cache_founf_inf`` right after ``scaler.step()`` to
decide whether the optimizer ran (and so whether to step the LR scheduler); this package's
scaler sets them after every step, so every skipped step is seen.

Imports PaddleNLP; the package never imports this module itself.
"""

from __future__ import annotations

from typing import Any, Optional

from paddlenlp.trainer import TrainerCallback

from .._log import warn_once
from ..scaler import GradScaler
from ..visualdl import VisualDLHook
from ..visualdl.writer import check_flush_bounds


class AmpCallback(TrainerCallback):
    """Attach a :class:`paddle_amp_ext.VisualDLHook` to the Trainer's scaler.

    Args:
        logdir: where the hook writes its run directory; default the Trainer's
            ``args.logging_dir`` (beside the Trainer's own VisualDL records).
        flush_every, flush_secs: the hook's write bounds (after this many steps or seconds).

    The hook logs every :data:`paddle_amp_ext.visualdl.TAGS` tag, ``amp/loss_scale`` included.
    """

    def __init__(self, logdir: Optional[str] = None, flush_every: int = 50, flush_secs: float = 30.0) -> None:
        check_flush_bounds(flush_every, flush_secs)
        self.logdir, self.flush_every, self.flush_secs = logdir, flush_every, flush_secs
        self.hook: Any = None
        self._scaler: Any = None

    def on_optimizer_begin(self, args: Any, state: Any, control: Any, scaler: Any = None, **kwargs: Any) -> None:
        if scaler is None or scaler is self._scaler:
            return
        if not isinstance(scaler, GradScaler):
            warn_once("paddlenlp:not-routed", "AmpCallback: the Trainer's scaler is Paddle's %s, so no AMP tags are "
                      "logged: call paddle_amp_ext.route() before importing paddlenlp.trainer.", type(scaler).__name__)
            return
        if self.hook is not None:
            self.hook.close()
        self._scaler = scaler
        self.hook = scaler.add_hook(VisualDLHook(self.logdir or args.logging_dir, flush_every=self.flush_every,
                                                 flush_secs=self.flush_secs))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hook is not None:
            self.hook.close()
            self._scaler.remove_hook(self.hook)
            self.hook = self._scaler = None
