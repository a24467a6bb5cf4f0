"""``paddle_amp_ext.debugging``: Paddle's AMP debugging tools, under this package's name.

Everything in the installed Paddle's ``paddle.amp.debugging`` (``TensorCheckerConfig``,
``DebugMode``, ``enable_tensor_checker``, ``collect_operator_stats``, ``compare_accuracy``, ...)
is importable from here, so code that routes ``paddle.amp`` to ``paddle_amp_ext`` keeps its
debugging calls. For overflow hunting on a CPU, see :func:`paddle_amp_ext.find_overflow`.
"""

from __future__ import annotations

from paddle.amp import debugging as _debugging
from paddle.amp.debugging import *  # noqa: F403 - the re-export is the point of this module

__all__ = list(getattr(_debugging, "__all__", ()))
