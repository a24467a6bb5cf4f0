"""Run under `paddle.distributed.launch`: ``python -m paddle_amp_ext.run ARGS`` in each worker.

``paddle.distributed.launch`` starts a script, not a module: this is ``-m`` for it.
"""

import runpy
import sys

sys.argv = ["paddle_amp_ext.run", *sys.argv[1:]]
runpy.run_module("paddle_amp_ext.run", run_name="__main__")
