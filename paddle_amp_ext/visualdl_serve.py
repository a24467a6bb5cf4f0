"""``python -m paddle_amp_ext.visualdl_serve --logdir runs`` (``paddle-amp-visualdl-serve``).

The command is :mod:`paddle_amp_ext.cli.visualdl_serve`.
"""

from __future__ import annotations

import sys

from .cli.visualdl_serve import command, main

__all__ = ["command", "main"]

if __name__ == "__main__":
    sys.exit(main())
