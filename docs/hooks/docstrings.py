"""MkDocs hook: the API reference's docstrings render as written, or the build fails.

``mkdocs build --strict`` fails on a docstring griffe cannot parse, but not on one it parses into
something else. This hook loads every object the API pages name (``::: paddle_amp_ext.X``) and
their public members with griffe, as mkdocstrings does, and fails the build when:

- a ``Returns:`` section parses into several items for a function that returns one value (a
  continuation line not indented: the rest of the sentence becomes a second, bogus item);
- a public property has no docstring (mkdocstrings hides it);
- a dataclass field is not described in the class's ``Attributes:`` section;
- a class names a private base (``Bases: _Something`` names nothing a reader can look up);
- a docstring cites a ``docs/...md`` path as text instead of linking the page.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List

import griffe

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"^:::\s*(paddle_amp_ext[\w.]*)", re.MULTILINE)
DOCS_PATH = re.compile(r"\bdocs/[\w/.-]+\.md\b")


def _directives() -> List[str]:
    found: List[str] = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        found += DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    return found


def _public(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and, for classes and modules, its public members (as the pages' filters show them)."""
    yield obj
    if obj.is_class or obj.is_module:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            if obj.is_module and not (member.is_class or member.is_function):
                continue
            yield from _public(member)


def _sections(obj: griffe.Object, kind: str) -> list:
    if not obj.docstring:
        return []
    return [s for s in obj.docstring.parse("google") if s.kind.value == kind]


def _returns_tuple(obj: griffe.Object) -> bool:
    annotation = str(getattr(obj, "returns", "") or "")
    return annotation.startswith(("Tuple", "tuple", "typing.Tuple"))


def problems(package: str = "paddle_amp_ext") -> List[str]:
    """Every docstring of the API pages' objects that would render other than as written."""
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)], docstring_parser=griffe.Parser.google)
    root = loader.load(package)
    loader.resolve_aliases(implicit=False, external=False)
    out: List[str] = []
    seen = set()
    for path in _directives():
        try:
            start = root[path[len(package) + 1:]] if path != package else root
        except KeyError:
            continue  # mkdocstrings reports a name it cannot find
        start = start.final_target if start.is_alias else start
        for obj in _public(start):
            if obj.path in seen:
                continue
            seen.add(obj.path)
            where = f"{obj.path} ({obj.relative_filepath}:{obj.lineno})"
            if obj.docstring and DOCS_PATH.search(obj.docstring.value):
                out.append(f"{where}: cites {DOCS_PATH.search(obj.docstring.value).group(0)} as text; link the "
                           "page from the docs instead, or name it in words")
            if obj.is_function and not _returns_tuple(obj):
                for section in _sections(obj, "returns"):
                    if len(section.value) > 1:
                        out.append(f"{where}: its Returns: section renders as {len(section.value)} items; indent "
                                   "the continuation lines under the first")
            if obj.is_attribute and "property" in obj.labels and not obj.docstring:
                out.append(f"{where}: a public property without a docstring is hidden from the reference")
            if obj.is_class:
                for base in obj.bases:
                    name = str(base).rsplit(".", 1)[-1]
                    if name.startswith("_") or str(base).split(".")[-2:-1] and str(base).split(".")[-2].startswith("_"):
                        out.append(f"{where}: its base {base} is private; the reference shows it as 'Bases: {base}'")
                if "dataclass" in obj.labels:
                    described = {a.name for s in _sections(obj, "attributes") for a in s.value}
                    for name, member in obj.members.items():
                        if member.is_attribute and not name.startswith("_") and "instance-attribute" in member.labels \
                                and name not in described and not member.docstring:
                            out.append(f"{where}: field {name!r} is not described in its Attributes: section")
    return out


def on_config(config):
    found = problems()
    if found:
        raise SystemExit("docs/hooks/docstrings.py: the API reference would not render as written:\n  "
                         + "\n  ".join(found))
    return config
