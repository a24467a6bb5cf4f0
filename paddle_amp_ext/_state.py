"""Process state shared by the core and the edges: whether fp16 emulation is active."""

from __future__ import annotations

from typing import List, Optional

_emulation: List[str] = []


def emulated_dtype() -> Optional[str]:
    """The dtype of the innermost active ``fp16_emulation`` context, or None."""
    return _emulation[-1] if _emulation else None


def push_emulation(dtype: str) -> None:
    _emulation.append(dtype)


def pop_emulation() -> None:
    _emulation.pop()
