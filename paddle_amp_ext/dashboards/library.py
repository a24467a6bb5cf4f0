"""A dashboard library's own run (SwanLab, W&B) as the target of a :class:`~.visualdl.writer.BatchedWriter`.

The writer batches the steps, reads their device values in one transfer and hands them on
within ``flush_secs``, exactly as for a record file; here the "file" is the library's run: each
step is "encoded" as a :class:`LoggedStep` (its number and ``{tag: value}``, NaN and inf kept)
and :meth:`LibraryRun.write` gives each to the library's ``log``. What the library then does
with it (its own buffer, its own thread or process, when it reaches the disk) is the library's:
the Dashboards page says what holds per backend.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Dict, List, Tuple

from .._log import logger, warn_once


class LoggedStep:
    """A step as a library's ``log`` takes it: the step and ``{tag: value}``."""

    __slots__ = ("step", "values")

    def __init__(self, step: int, values: Dict[str, float]) -> None:
        self.step, self.values = step, values

    def __repr__(self) -> str:
        return f"LoggedStep({self.step!r}, {self.values!r})"


class StepValues:
    """The encoder of a library's run: a step as a :class:`LoggedStep` (what :meth:`LibraryRun.write` takes).

    Raises (from ``step``) TypeError for a value that is no real number, as the file encoders do.
    """

    def step(self, step: int, walltime_ms: int, values: List[Tuple[str, float]]) -> LoggedStep:
        for tag, value in values:
            if value.__class__ is not float and not isinstance(value, numbers.Real):
                raise TypeError(f"A recorded value must be a real number. Received: {value!r} "
                                f"(of type {type(value).__name__}) for {tag!r}")
        return LoggedStep(step, dict(values))


class LibraryRun:
    """A library's run in ``directory`` (created by the library, inside the hook's run directory).

    Subclasses open the run in :meth:`_open` and implement :meth:`_log` and :meth:`_finish`.

    Args:
        directory: the hook's run directory (``logdir/RUN``), created already.
        name: the run's name on the dashboard.
    """

    #: the library's name, for messages
    library = ""
    #: each step is handed on once, whole (W&B drops a step logged again after a later one)
    whole_steps = True

    def __init__(self, directory: str, name: str) -> None:
        self.dir = directory
        self.name = name
        self.path = directory
        self._pid = os.getpid()  # a forked child's copy never finishes the parent's run
        self._run: Any = self._open()

    def _open(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _log(self, step: int, values: Dict[str, float]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _finish(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def write(self, steps: List[LoggedStep]) -> None:
        """Give each step (made by :class:`StepValues`) to the library's ``log``."""
        if self._run is None:
            raise OSError(f"the {self.library} run in {self.dir} is finished")
        for logged in steps:
            step, values = logged.step, logged.values
            if step < 0:
                warn_once(f"dashboards:negative:{id(self)}", "%s does not take a negative step (%d): such steps are "
                          "not sent to it (they are in the VisualDL and TensorBoard records).", self.library, step)
                continue
            self._log(step, values)

    def removed(self) -> bool:
        """A library run is not a file that can be removed under the writer: never."""
        return False

    def reopen(self) -> str:  # pragma: no cover - removed() is never True
        return self.path

    def signalled(self) -> None:
        """SIGTERM or SIGINT arrived (the steps were just handed on): finish the run, which is
        when the library writes what it buffered, before the signal ends the process."""
        logger.warning("%s: the run in %s is finished on the signal, so its buffered steps reach the disk; steps "
                       "logged after it, if the process goes on, are not sent to %s.", self.library, self.dir,
                       self.library)
        self.close()

    def close(self) -> None:
        """Finish the library's run (it writes what it buffered). Idempotent."""
        if self._run is None:
            return
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker): the parent's run stays open
            self._run = None
            return
        try:
            self._finish()
        except Exception as exc:  # noqa: BLE001 - a library's failure at exit never hides the training's result
            logger.warning("%s could not finish its run in %s: %r", self.library, self.dir, exc)
        finally:
            self._run = None
