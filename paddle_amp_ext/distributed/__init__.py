"""Distributed decisions: one skip for every rank, the norm of the gradient the optimizer applies.

- :mod:`.flags`: the found_inf flag agreed (MAX) over the ranks, and its one read to the host.
- :mod:`.layout`: where the gradients are reduced (already in backward, or inside
  ``optimizer.step()`` by fleet) and so where a clip must run.
- :mod:`.skip`: the skip decision, one strategy per layout (its decision map), for the scaler
  and ``guard_optimizer`` alike; :func:`agree_found_inf` asks it.
- :mod:`.norm`: the clip run inside the step of an optimizer that reduces the gradients there
  (fleet, auto-dp), with the global norm computed as the step computes it (:mod:`.clips`).

The fleet internals these read live in :mod:`paddle_amp_ext._compat.fleet`.
"""

from __future__ import annotations

from .flags import all_reduce_max, host_bool
from .layout import Layout, flags_agree, layout_of
from .norm import norm_covers_every_grad, step_clipped, step_unless_nonfinite
from .skip import SkipStrategy, agree_found_inf, strategy_of

__all__ = ["Layout", "SkipStrategy", "agree_found_inf", "all_reduce_max", "flags_agree", "host_bool", "layout_of",
           "norm_covers_every_grad", "step_clipped", "step_unless_nonfinite", "strategy_of"]
