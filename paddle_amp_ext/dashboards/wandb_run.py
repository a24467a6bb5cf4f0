"""W&B's own run, for a user who chose a W&B mode other than offline (``WANDB_MODE=online``...).

Offline (the default), ``report_to="wandb"`` writes W&B's offline run file itself
(:mod:`.wandb_file`); with ``WANDB_MODE=online`` (or ``shared``, ``disabled``) the steps go to
W&B's library, which uploads them live from its service process, at its own cost (about 0.44 ms
a ``log()``, in the flusher's thread).
"""

from __future__ import annotations

import os
from typing import Any, Dict

from .library import LibraryRun


class WandbRun(LibraryRun):
    """A W&B run in ``directory/wandb/`` in the mode of ``WANDB_MODE``. W&B is imported here, at the
    first hook that reports to it; its service process starts with the run.

    Each step is committed as it is logged (``commit=True``), so the last step is not held back
    for a next one.
    """

    library = "W&B"

    def _open(self) -> Any:
        import wandb  # installed: backends.require asked before the run directory was made

        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                                  x_disable_machine_info=True, x_save_requirements=False, save_code=False,
                                  disable_git=True, disable_job_creation=True)
        return wandb.init(mode=os.environ["WANDB_MODE"].strip().lower(), dir=self.dir, project="paddle-amp-ext",
                          name=self.name, reinit="create_new", settings=settings)

    def _log(self, step: int, values: Dict[str, float]) -> None:
        self._run.log(values, step=step, commit=True)

    def _finish(self) -> None:
        self._run.finish()
