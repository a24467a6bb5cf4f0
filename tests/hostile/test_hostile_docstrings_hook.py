"""docs/hooks/docstrings.py given hostile packages and pages: names that do not exist, lazy
exports, an empty package, a base bound at run time, a Returns: section of a tuple."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "docstrings.py"


@pytest.fixture(scope="module")
def hook():
    pytest.importorskip("griffe", reason="griffe is in the [test] extra and docs/requirements.txt")
    spec = importlib.util.spec_from_file_location("docs_hook_docstrings_hostile", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, files: dict) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, text in files.items():
        (pkg / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_an_empty_package_has_no_problems(hook, tmp_path):
    root = _package(tmp_path, {"__init__.py": ""})
    assert hook.problems("pkg", [], search_path=root) == []


def test_a_directive_naming_nothing_is_left_to_mkdocstrings(hook, tmp_path):
    root = _package(tmp_path, {"__init__.py": '"""Doc."""\n'})
    assert hook.problems("pkg", ["pkg.missing", "pkg.also.missing!bases!members"], search_path=root) == []


def test_an_all_name_that_does_not_exist_is_a_problem(hook, tmp_path):
    root = _package(tmp_path, {"__init__.py": '__all__ = ["ghost"]\n'})
    found = hook.problems("pkg", ["pkg!members"], search_path=root)
    assert len(found) == 1
    assert re.fullmatch(r"pkg\.ghost \(\S*pkg/__init__\.py\): in pkg\.__all__ but not in the API reference; make it "
                        r"private \(out of __all__, a _module\) or document it", found[0]), found


def test_a_lazy_export_documented_from_its_submodule_is_fine(hook, tmp_path):
    root = _package(tmp_path, {
        "__init__.py": '__all__ = ["thing"]\n\ndef __getattr__(name):\n    from . import impl\n    return impl.thing\n',
        "impl.py": 'def thing() -> None:\n    """A thing."""\n',
    })
    assert hook.problems("pkg", ["pkg!members", "pkg.impl.thing"], search_path=root) == []
    assert len(hook.problems("pkg", ["pkg!members"], search_path=root)) == 1


def test_a_base_bound_at_run_time_to_a_third_party_class_is_not_a_problem(hook, tmp_path):
    root = _package(tmp_path, {"__init__.py": (
        'import importlib\n\nBase = importlib.import_module("collections").OrderedDict\n\n\n'
        'class Thing(Base):\n    """A thing."""\n')})
    assert hook.problems("pkg", ["pkg.Thing"], search_path=root) == []


def test_a_tuple_may_return_several_items_and_a_bad_docstring_does_not_crash(hook, tmp_path):
    root = _package(tmp_path, {"__init__.py": (
        'from typing import Tuple\n\n\ndef pair() -> Tuple[int, int]:\n    """Two.\n\n    Returns:\n'
        '        int: the first.\n        int: the second.\n    """\n\n\n'
        'def odd() -> int:\n    """Returns:\n\n    Raises:\n    Args: x\n    """\n')})
    assert hook.problems("pkg", ["pkg.pair", "pkg.odd"], search_path=root) == []


def test_on_config_fails_the_build_naming_every_problem(hook, monkeypatch):
    monkeypatch.setattr(hook, "problems", lambda: ["a.b (a.py:1): its Returns: section renders as 2 items"])
    with pytest.raises(SystemExit, match=r"would not render as written:\n  a\.b \(a\.py:1\): its Returns"):
        hook.on_config({})
    monkeypatch.setattr(hook, "problems", lambda: [])
    assert hook.on_config({"x": 1}) == {"x": 1}
