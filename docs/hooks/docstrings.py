"""MkDocs hook: the API reference's docstrings render as written, or the build fails.

``mkdocs build --strict`` fails on a docstring griffe cannot parse, but not on one it parses into
something else. This hook loads every object the API pages name (``::: paddle_amp_ext.X``) and
their public members with griffe, as mkdocstrings does, and fails the build when:

- a ``Returns:`` section parses into several items for a function that returns one value (a
  continuation line not indented: the rest of the sentence becomes a second, bogus item);
- a public property has no docstring (mkdocstrings hides it);
- a dataclass field is not described in the class's ``Attributes:`` section;
- a class names a base a reader cannot look up: a private one (``Bases: _Something``) or one of
  the package's that the reference does not document (``Bases: NotCopyable``);
- a docstring cites a ``docs/...md`` path as text instead of linking the page;
- a public package's ``__all__`` exports a name the reference does not document (``cli``'s
  helpers): make it private, or document it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Optional

import griffe

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"^:::\s*(paddle_amp_ext[\w.]*)((?:\n[ \t]+\S.*)*)", re.MULTILINE)
NO_BASES = re.compile(r"^\s*show_bases:\s*false\s*$", re.MULTILINE)
NO_MEMBERS = re.compile(r"^\s*members:\s*false\s*$", re.MULTILINE)
DOCS_PATH = re.compile(r"\bdocs/[\w/.-]+\.md\b")


def _directives() -> List[str]:
    """The ``:::`` paths of the API pages, with ``!bases`` where the options hide the bases
    (``show_bases: false``) and ``!members`` where they hide the members (``members: false``)."""
    found: List[str] = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for path, options in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            found.append(path + ("!bases" if NO_BASES.search(options) else "")
                         + ("!members" if NO_MEMBERS.search(options) else ""))
    return found


def _public(obj: griffe.Object, members: bool = True) -> Iterator[griffe.Object]:
    """``obj`` and, for classes and modules, its public members (as the pages' filters show them)."""
    yield obj
    if members and (obj.is_class or obj.is_module):
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


def _target(obj: griffe.Object) -> griffe.Object:
    try:
        return obj.final_target if obj.is_alias else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return obj


def _rendered(root: griffe.Object, package: str, directives: List[str]) -> List[griffe.Object]:
    """The objects the API pages render, each once, in page order."""
    out: List[griffe.Object] = []
    seen = set()
    for directive in directives:
        path = directive.split("!")[0]
        try:
            start = root[path[len(package) + 1:]] if path != package else root
        except KeyError:
            continue  # mkdocstrings reports a name it cannot find
        for obj in _public(_target(start), members="!members" not in directive):
            if obj.path not in seen:
                seen.add(obj.path)
                out.append(obj)
    return out


def _target_path(root: griffe.Object, package: str, path: str) -> str:
    try:
        return _target(root[path[len(package) + 1:]] if path != package else root).path
    except KeyError:
        return path


def _is_class(root: griffe.Object, package: str, path: str) -> bool:
    """Whether ``path`` names a class of the package (not, say, a variable bound to a third-party class)."""
    try:
        return _target(root[path[len(package) + 1:]]).is_class
    except KeyError:
        return False


def _packages(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and its public subpackages, recursively."""
    yield obj
    for name, member in obj.members.items():
        if not name.startswith("_") and not member.is_alias and member.is_module and member.is_init_module:
            yield from _packages(member)


def problems(package: str = "paddle_amp_ext", directives: Optional[List[str]] = None,
             search_path: Optional[Path] = None) -> List[str]:
    """Every docstring of the API pages' objects that would render other than as written.

    Args:
        package: the package the pages document.
        directives: the ``:::`` paths the pages name (default: those of ``docs/api/*.md``).
        search_path: where ``package`` is found (default: the repository).

    Returns:
        One sentence per problem, naming the object, its file and line, and the fix.
    """
    loader = griffe.GriffeLoader(search_paths=[str(search_path or ROOT)], docstring_parser=griffe.Parser.google)
    root = loader.load(package)
    loader.resolve_aliases(implicit=False, external=False)
    directives = _directives() if directives is None else directives
    hidden_bases = {d.split("!")[0] for d in directives if "!bases" in d}
    out: List[str] = []
    rendered = _rendered(root, package, directives)
    documented = {obj.path for obj in rendered} | {d.split("!")[0] for d in directives}
    for pkg in _packages(root):
        for name in pkg.exports or ():
            name = str(name)
            member = pkg.members.get(name)
            if f"{pkg.path}.{name}" in documented or (member is not None and _target(member).path in documented):
                continue
            if member is None and any(d.startswith(pkg.path + ".") and d.endswith("." + name) for d in documented):
                continue  # served by the package's __getattr__ from a documented submodule
            out.append(f"{pkg.path}.{name} ({pkg.relative_filepath}): in {pkg.path}.__all__ but not in the API "
                       "reference; make it private (out of __all__, a _module) or document it")
    hidden = {_target_path(root, package, d) for d in hidden_bases}
    for obj in rendered:
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
        if obj.is_class and obj.path not in hidden:
            for base in obj.bases:
                name = str(base).rsplit(".", 1)[-1]
                full = getattr(base, "canonical_path", str(base))
                if name.startswith("_") or any(part.startswith("_") for part in full.split(".")[1:-1]):
                    out.append(f"{where}: its base {base} is private; the reference shows it as 'Bases: {base}'")
                elif full.startswith(package + ".") and full not in documented and _is_class(root, package, full):
                    out.append(f"{where}: its base {full} is not in the API reference; the reference shows "
                               f"'Bases: {name}', which names nothing a reader can look up")
        if obj.is_class and "dataclass" in obj.labels:
            described = {a.name for kind in ("attributes", "parameters") for s in _sections(obj, kind) for a in s.value}
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
