"""One process: the flag is the decision, with no collective."""

from __future__ import annotations

from .data_parallel import DataParallel


class SingleProcess(DataParallel):
    """One process (no default process group, or a world of one): nothing to agree. Agrees as
    :class:`DataParallel` does, which in a world of one runs no collective (and stays right if a
    process group of several appears after the strategy was chosen)."""

    name = "single"
    gradients = "the gradient the optimizer applies"
