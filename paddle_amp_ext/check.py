"""``python -m paddle_amp_ext.check``: see :mod:`paddle_amp_ext.cli.check` (the command's entry point)."""

from __future__ import annotations

import sys

from .cli.check import CheckReport, collect, main, parse_what_if, render

__all__ = ["CheckReport", "collect", "main", "parse_what_if", "render"]

if __name__ == "__main__":
    sys.exit(main())
