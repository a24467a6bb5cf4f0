"""The ```python blocks of README.md and docs/**/*.md, for tests/test_docs_examples.py.

A block right after a ``<!-- skip: REASON -->`` line (blank lines between allowed) is not run;
``docs/hooks/examples.py`` shows the reason on the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"^<!--\s*skip:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip: Optional[str]  # the reason, or None when the block is run


def pages(root: Path = ROOT) -> List[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(path: Path, root: Path = ROOT) -> List[Block]:
    """Every fenced code block of ``path``; a fence left open is a ``ValueError``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i, last_text = [], 0, ""
    while i < len(lines):
        stripped = lines[i].strip()
        match = FENCE.match(stripped)
        if not match:
            if stripped:
                last_text = stripped
            i += 1
            continue
        fence, language, start = match.group(1), match.group(2).lower(), i
        indent = len(lines[i]) - len(lines[i].lstrip())
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            line = lines[i]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: a code block opened here is never closed")
        skip = SKIP.match(last_text)
        if skip and not skip.group(1):
            raise ValueError(f"{path}:{start + 1}: a skip marker needs a reason: <!-- skip: needs a GPU -->")
        found.append(Block(str(path.relative_to(root)), start + 1, language, "\n".join(body) + "\n",
                           skip.group(1) if skip else None))
        last_text = ""
        i += 1
    return found


def python_blocks(root: Path = ROOT) -> List[Block]:
    return [b for page in pages(root) for b in blocks(page, root) if b.language in ("python", "py")]
