"""W&B's run, in its offline mode, as a writer target: ``report_to="wandb"``."""

from __future__ import annotations

from typing import Any, Dict

from .library import LibraryRun, environ_flag


class WandbRun(LibraryRun):
    """A W&B run in ``directory/wandb/offline-run-*`` (``mode="offline"`` unless the user set
    ``WANDB_MODE``: nothing is sent; ``wandb sync DIR`` uploads it later). W&B is imported here, at
    the first hook that reports to it; its service process starts with the run.

    Each step is committed as it is logged (``commit=True``), so the last step is not held back
    for a next one.
    """

    library = "W&B"

    def _open(self) -> Any:
        import wandb

        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                                  x_disable_machine_info=True, x_save_requirements=False, save_code=False,
                                  disable_git=True, disable_job_creation=True)
        return wandb.init(mode=environ_flag("WANDB_MODE", "offline"), dir=self.dir, project="paddle-amp-ext",
                          name=self.name, reinit="create_new", settings=settings)

    def _log(self, step: int, values: Dict[str, float]) -> None:
        self._run.log(values, step=step, commit=True)

    def _finish(self) -> None:
        self._run.finish()
