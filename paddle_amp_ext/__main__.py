"""``python -m paddle_amp_ext`` runs the check."""

import sys

from .check import main

sys.exit(main())
