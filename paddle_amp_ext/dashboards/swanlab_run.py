"""SwanLab's own run, for a user who chose a SwanLab mode other than offline (``SWANLAB_MODE=online``...).

Offline (the default), ``report_to="swanlab"`` writes SwanLab's offline run file itself
(:mod:`.swanlab_file`); with ``SWANLAB_MODE=online`` (or ``local``, ``disabled``) the steps go to
SwanLab's library, in that mode, at its own cost (a ``log()`` per step in the flusher's thread).
"""

from __future__ import annotations

import os
from typing import Any, Dict

from .library import LibraryRun


class SwanLabRun(LibraryRun):
    """A SwanLab run in ``directory`` in the mode of ``SWANLAB_MODE`` (offline when unset). SwanLab
    is imported here, at the first hook that reports to it.

    SwanLab 0.10.3 keeps one run per process: a second ``SwanLabRun`` finishes the first
    (``reinit``), so give SwanLab one hook per process.
    """

    library = "SwanLab"

    def _open(self) -> Any:
        import swanlab

        settings = swanlab.Settings(interactive=False, terminal={"proxy_type": "none"},  # the console is not copied
                                    probe={"hardware": False, "runtime": False, "requirements": False, "conda": False,
                                           "git": False, "swanlab": False, "monitor": False})
        return swanlab.init(project="paddle-amp-ext", name=self.name, log_dir=self.dir,
                            mode=os.environ.get("SWANLAB_MODE", "").strip().lower() or "offline",
                            reinit=True, settings=settings)

    def _log(self, step: int, values: Dict[str, float]) -> None:
        self._run.log(values, step=step)

    def _finish(self) -> None:
        self._run.finish()
