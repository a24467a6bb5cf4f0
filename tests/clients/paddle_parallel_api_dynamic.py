"""The dynamic part of Paddle's own ``test/auto_parallel/hybrid_strategy/parallel_api.py``:
``TestParallelAPI().run_llama(0)``, configured by the environment variables Paddle's runner
(``test_parallel_api_with_llama_*.py``) passes. argv: HYBRID_STRATEGY_DIR (the folder of Paddle's
checkout holding parallel_api.py, single_llama_model.py and single_lora_model.py).

Run by tests/clients/test_paddle_parallel_api.py under ``paddle.distributed.launch`` and
``python -m paddle_amp_ext.run --emulate float16``.
"""

import logging
import sys

import numpy as np
from paddle.distributed.auto_parallel.process_mesh import ProcessMesh

sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)


def _rank_by_dim(self, dim, process_id):
    """Paddle 3.3.1's ``get_rank_by_dim_and_process_id`` with ``.item()``: it calls ``int()`` on a
    1-element array, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted")."""
    if process_id not in self._process_ids:
        return -1
    if dim is None:
        return 0
    name = self._dim_names[dim] if isinstance(dim, int) else dim
    return int(np.where(self._mesh == process_id)[self._dim_names.index(name)].item())


ProcessMesh.get_rank_by_dim_and_process_id = _rank_by_dim

import parallel_api  # noqa: E402

parallel_api.TestParallelAPI().run_llama(0)
