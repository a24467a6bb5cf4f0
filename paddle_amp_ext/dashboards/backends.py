"""The dashboards a hook can report to, and ``report_to=`` (PaddleFormers' word) parsed once.

``report_to`` is a name or a list of names (a comma-separated string too, as ``run --report-to``
takes it): ``"visualdl"`` (the default), ``"tensorboard"``, ``"swanlab"``, ``"wandb"``. Each
backend's library is an optional extra, located here (never imported) so a missing one is named
before a run starts. TensorBoard's event file and W&B's and SwanLab's offline runs are written
without theirs (needed to view or upload them); W&B's (SwanLab's) own library is needed when
``WANDB_MODE`` (``SWANLAB_MODE``) asks for another mode (online: it uploads live).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import swanlab_file, wandb_file


@dataclass(frozen=True)
class Backend:
    """One dashboard.

    Args:
        name: the ``report_to`` name.
        module: the library that must be installed to write (None: written without one; W&B's and
            SwanLab's are needed in a mode other than offline, see :func:`require`).
        extra: the ``pip install 'paddle-amp-ext[EXTRA]'`` that installs it.
        local: the records are a file this package writes itself (the ``flush_secs`` bound holds
            to the operating system); False: the steps are handed to the library within the
            bound, and the library decides when they reach the disk.
    """

    name: str
    module: Optional[str]
    extra: str
    local: bool


BACKENDS: Tuple[Backend, ...] = (
    Backend("visualdl", "visualdl", "visualdl", local=True),
    Backend("tensorboard", None, "tensorboard", local=True),  # the event file needs no library to be written
    Backend("swanlab", None, "swanlab", local=True),  # the offline run file (SWANLAB_MODE=online: SwanLab's own run)
    Backend("wandb", None, "wandb", local=True),  # the offline run file too (WANDB_MODE=online: W&B's own run)
)

#: Every ``report_to`` name.
NAMES: Tuple[str, ...] = tuple(backend.name for backend in BACKENDS)
DEFAULT = ("visualdl",)


def backend(name: str) -> Backend:
    """The backend called ``name`` (one of :data:`NAMES`), or ValueError naming the known ones."""
    if name not in NAMES:
        raise _unknown(name)
    return BACKENDS[NAMES.index(name)]


def _unknown(name: Any) -> ValueError:
    close = difflib.get_close_matches(str(name).lower(), NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"Unknown dashboard {name!r} in report_to.{hint} Expected one of {list(NAMES)}, or a list "
                      "of them.")


def parse_report_to(report_to: Any = "visualdl", *, allow_none: bool = False) -> Tuple[str, ...]:
    """``report_to`` as a tuple of backend names, in the order given, each once.

    Args:
        report_to: a name (``"tensorboard"``), a comma-separated string (``"visualdl,wandb"``), or
            a list or tuple of names. Case and surrounding spaces are ignored.
        allow_none: accept ``"none"``, ``None`` and an empty list (no dashboard: the Trainer's
            callback then only adds its values to the Trainer's own logs).

    Returns:
        The names, such as ``("visualdl", "tensorboard")``.

    Raises:
        TypeError: ``report_to`` is not a string or a list of strings.
        ValueError: an unknown or repeated name, or no name where one is needed.

    Example:
        >>> parse_report_to(["visualdl", "tensorboard"])
        ('visualdl', 'tensorboard')
    """
    if report_to is None:
        items: list = []
    elif isinstance(report_to, str):
        items = [part for part in report_to.split(",")] if report_to.strip() else []
    elif isinstance(report_to, (list, tuple)):
        items = list(report_to)
    else:
        raise TypeError(f"report_to must be a dashboard name or a list of them, such as 'tensorboard' or "
                        f"['visualdl', 'wandb']. Received: report_to={report_to!r} (of type "
                        f"{type(report_to).__name__})")
    names = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"report_to must hold dashboard names (str). Received: {item!r} (of type "
                            f"{type(item).__name__}) in report_to={report_to!r}")
        name = item.strip().lower()
        if name == "none" and allow_none and len(items) == 1:
            return ()
        if name not in NAMES:
            raise _unknown(item)
        if name in names:
            raise ValueError(f"report_to names {name!r} twice: {report_to!r}. Name each dashboard once.")
        names.append(name)
    if not names and not allow_none:
        raise ValueError(f"report_to names no dashboard: {report_to!r}. Expected one or more of {list(NAMES)}.")
    return tuple(names)


def view_command(name: str, logdir: str, run_dir: str) -> str:
    """How to look at backend ``name``'s records of the run in ``run_dir`` (under ``logdir``): the
    command the hook logs when it starts.

    Args:
        name: a :data:`NAMES` name.
        logdir: the directory given to the hook (VisualDL and TensorBoard show all its runs).
        run_dir: the run's own directory (W&B and SwanLab keep their run in it).

    Returns:
        The shell command, such as ``"tensorboard --logdir runs --host 127.0.0.1"``.

    Raises:
        ValueError: ``name`` is not a backend.

    Example:
        >>> view_command("wandb", "runs", "runs/exp")
        "wandb leet runs/exp/wandb (W&B's terminal viewer; upload: wandb sync runs/exp/wandb/offline-run-*)"
    """
    backend(name)
    if name == "visualdl":
        return f"python -m paddle_amp_ext.visualdl_serve --logdir {logdir}"
    if name == "tensorboard":
        return f"tensorboard --logdir {logdir} --host 127.0.0.1"
    if name == "swanlab":
        if not swanlab_file.wants_own_file():  # SwanLab's own run, in SWANLAB_MODE
            return f"swanlab sync {os.path.join(run_dir, 'run-*')} (SwanLab uploads it in SWANLAB_MODE=online)"
        return f"swanlab sync {os.path.join(run_dir, 'run-*')} (uploads it: SwanLab has no offline viewer)"
    runs = os.path.join(run_dir, "wandb")
    if not wandb_file.wants_own_file():  # W&B's own run, in WANDB_MODE
        return f"wandb leet {runs} (W&B's terminal viewer; W&B uploads it in WANDB_MODE=online)"
    return f"wandb leet {runs} (W&B's terminal viewer; upload: wandb sync {os.path.join(runs, 'offline-run-*')})"


def require(name: str) -> None:
    """Raise ImportError naming the extra when backend ``name``'s library is not installed
    (located, not imported: importing VisualDL writes ``~/.visualdl``, W&B starts nothing yet)."""
    spec = backend(name)
    module = spec.module
    if name == "wandb" and not wandb_file.wants_own_file():
        module = "wandb"  # WANDB_MODE=online (or shared, disabled): W&B's own run
    if name == "swanlab" and not swanlab_file.wants_own_file():
        module = "swanlab"  # SWANLAB_MODE=online (or local, disabled): SwanLab's own run
    if module is None:
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        what = "VisualDL hooks need VisualDL" if name == "visualdl" else f"report_to={name!r} needs {module}"
        if name == "wandb":
            what += (f" with WANDB_MODE={os.environ.get('WANDB_MODE')!r} (unset it for the offline run, written "
                     "without it)")
        if name == "swanlab":
            what += (f" with SWANLAB_MODE={os.environ.get('SWANLAB_MODE')!r} (unset it for the offline run, written "
                     "without it)")
        raise ImportError(f"{what}: pip install 'paddle-amp-ext[{spec.extra}]'")
