"""``python -m paddle_amp_ext.visualdl_serve --logdir runs``: see :mod:`paddle_amp_ext.cli.visualdl`."""

from __future__ import annotations

import sys

from .cli.visualdl import command, main

__all__ = ["command", "main"]

if __name__ == "__main__":
    sys.exit(main())
