"""Integrations with the tools Paddle users train with.

- Routing (:mod:`paddle_amp_ext.run.routing`, its names re-exported here): make ``paddle.amp``'s
  ``GradScaler``, ``auto_cast`` and ``decorate`` be this package's, reversibly, for code you do
  not own (toolkits, hapi, unmodified scripts).
- :mod:`.hapi`: ``paddle.Model.fit`` helpers.
- :mod:`.paddlenlp` (also as :mod:`.paddleformers`): a ``TrainerCallback`` for PaddleFormers' or
  PaddleNLP's Trainer, whichever is installed (imports it; not imported here).
"""

from __future__ import annotations

from ..run.routing import Routing, active_routing, route, routed, unroute
from .hapi import hapi_amp_configs

__all__ = ["Routing", "active_routing", "hapi_amp_configs", "route", "routed", "unroute"]
