"""``python -m paddle_amp_ext`` runs the check."""

import sys

from .cli.check import main

sys.exit(main())
