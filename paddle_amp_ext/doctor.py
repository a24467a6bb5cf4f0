"""``python -m paddle_amp_ext.doctor SCRIPT [ARGS]``: see :mod:`paddle_amp_ext.cli.doctor`.

The doctor itself (``find_overflow``, ``OverflowWatch``) is :mod:`paddle_amp_ext.rehearsal.doctor`;
this module is only the command's entry point, so the package never imports it (and ``-m`` runs
it without runpy's "found in sys.modules" warning).
"""

from __future__ import annotations

import sys

from .cli.doctor import main

if __name__ == "__main__":
    sys.exit(main())
