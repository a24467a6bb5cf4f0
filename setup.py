"""Setuptools shim: the metadata lives in pyproject.toml (PEP 621); this adds the long description.

The registry page shows ``README.md`` away from the repository, where its relative links and
images would break: :func:`registry_readme` makes them absolute, from ``[project.urls] Source``
(links to ``blob/main/...``, images to ``raw/main/...``). The README in the repository keeps its
relative links (GitHub and the docs site resolve them).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # a build requirement on these Pythons (pyproject.toml)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
#: ``[text](target)`` and ``![alt](target)``; a target with a scheme or a bare ``#anchor`` stays.
_LINK = re.compile(r"(?P<image>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_ABSOLUTE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|/)")


def registry_readme(text: str, source: str, ref: str = "main") -> str:
    """``text`` (Markdown) with every relative link and image made absolute under ``source``."""
    base = source.rstrip("/")

    def absolute(match: re.Match) -> str:
        target = match["target"]
        if _ABSOLUTE.match(target):
            return match.group(0)
        kind = "raw" if match["image"] else "blob"
        path = target[2:] if target.startswith("./") else target
        return f"{match['image']}[{match['text']}]({base}/{kind}/{ref}/{path})"

    return _LINK.sub(absolute, text)


def _long_description() -> str:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        source = tomllib.load(handle)["project"]["urls"]["Source"]
    return registry_readme((ROOT / "README.md").read_text(encoding="utf-8"), source)


if __name__ == "__main__":
    from setuptools import setup

    setup(long_description=_long_description(), long_description_content_type="text/markdown")
