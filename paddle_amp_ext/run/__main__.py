"""``python -m paddle_amp_ext.run SCRIPT [ARGS]``: see :mod:`paddle_amp_ext.cli.run`."""

from __future__ import annotations

import sys

from ..cli.run import main

if __name__ == "__main__":
    sys.exit(main())
