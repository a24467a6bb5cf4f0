"""SwanLab's run, in its offline mode, as a writer target: ``report_to="swanlab"``."""

from __future__ import annotations

from typing import Any, Dict

from .library import LibraryRun


class SwanLabRun(LibraryRun):
    """A SwanLab run in ``directory`` (``mode="offline"``: nothing is sent; ``swanlab sync DIR``
    uploads it later). SwanLab is imported here, at the first hook that reports to it.

    SwanLab 0.10.3 keeps one run per process: a second ``SwanLabRun`` finishes the first
    (``reinit``), so give SwanLab one hook per process.
    """

    library = "SwanLab"

    def _open(self) -> Any:
        import swanlab

        settings = swanlab.Settings(interactive=False, terminal={"proxy_type": "none"},  # the console is not copied
                                    probe={"hardware": False, "runtime": False, "requirements": False, "conda": False,
                                           "git": False, "swanlab": False, "monitor": False})
        return swanlab.init(project="paddle-amp-ext", name=self.name, log_dir=self.dir, mode="offline",
                            reinit=True, settings=settings)

    def _log(self, step: int, values: Dict[str, float]) -> None:
        self._run.log(values, step=step)

    def _finish(self) -> None:
        self._run.finish()
