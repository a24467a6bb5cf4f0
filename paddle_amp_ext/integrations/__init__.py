"""Integrations with the tools Paddle users train with.

- :mod:`.routing`: make ``paddle.amp``'s ``GradScaler``, ``auto_cast`` and ``decorate`` be this
  package's, reversibly, for code you do not own (toolkits, hapi, unmodified scripts).
- :mod:`.hapi`: ``paddle.Model.fit`` helpers.
- :mod:`.paddlenlp`: a PaddleNLP ``TrainerCallback`` (imports PaddleNLP; not imported here).
"""

from __future__ import annotations

from .hapi import hapi_amp_configs
from .routing import Routing, active_routing, route, routed, unroute

__all__ = ["Routing", "active_routing", "hapi_amp_configs", "route", "routed", "unroute"]
