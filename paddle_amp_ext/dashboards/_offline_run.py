"""What names an offline run file W&B and SwanLab write alike: the run's id and start, its directory's
and its file's names."""

from __future__ import annotations

import secrets
import string
import time
from dataclasses import dataclass, field
from typing import ClassVar

_ID_CHARS = string.ascii_lowercase + string.digits


def new_run_id() -> str:
    """A run id as W&B and SwanLab make one (SwanLab's ``generate_id``): 8 random base-36 characters."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


@dataclass(frozen=True)
class OfflineRun:
    """What a run's first records hold, fixed when the run opens; a library's subclass sets
    :attr:`DIR_PREFIX` and :attr:`EXTENSION` and adds its own fields."""

    DIR_PREFIX: ClassVar[str] = "run-"
    EXTENSION: ClassVar[str] = ""

    name: str
    project: str = "paddle-amp-ext"
    run_id: str = field(default_factory=new_run_id)
    start_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def dir_name(self) -> str:
        """``<prefix><local start time>-<id>``, as the library names an offline run's directory."""
        return f"{self.DIR_PREFIX}{time.strftime('%Y%m%d_%H%M%S', time.localtime(self.start_ms / 1000))}-{self.run_id}"

    @property
    def file_name(self) -> str:
        return f"run-{self.run_id}{self.EXTENSION}"
