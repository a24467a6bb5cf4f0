"""PaddleFormers' ``Trainer`` with this package: :class:`AmpCallback`, the same callback as for PaddleNLP.

    import paddle_amp_ext as amp
    amp.route()                                              # before importing paddleformers.trainer
    from paddle_amp_ext.integrations.paddleformers import AmpCallback
    trainer = Trainer(..., callbacks=[AmpCallback()])

See :mod:`paddle_amp_ext.integrations.paddlenlp` (the callback is a ``TrainerCallback`` of whichever
toolkit is installed). Imports PaddleFormers; the package never imports this module itself.
"""

from __future__ import annotations

from .paddlenlp import AmpCallback

__all__ = ["AmpCallback"]
