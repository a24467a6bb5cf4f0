"""The documentation site's sources: every public name has its API entry, the README
stays short and keeps the set-up commands, the CLI pages and the CHANGELOG are generated or
included, not copied. The strict build itself is ``bash scripts/docs`` (CI runs it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import paddle_amp_ext as amp

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "api"
DIRECTIVE = re.compile(r"^:::\s*([\w.]+)\s*$", re.MULTILINE)


def _api_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(API.glob("*.md")))


def _documented() -> set:
    """The last component of every mkdocstrings directive on the API pages."""
    return {path.rsplit(".", 1)[-1] for path in DIRECTIVE.findall(_api_text())}


def _served_from_paddle() -> set:
    """The names of the API page's table of names served from ``paddle.amp``."""
    text = (API / "index.md").read_text(encoding="utf-8")
    table = text[text.index("## Served from `paddle.amp`"):]
    return set(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE))


def test_every_public_name_has_an_api_entry():
    documented, served = _documented(), _served_from_paddle()
    own = [name for name in amp.__all__ if name not in amp._PADDLE_AMP or name in vars(amp) or name in amp._LAZY]
    missing = [name for name in own if name not in documented]
    assert not missing, f"no ':::' entry in docs/api/*.md for {missing}"
    passthrough = [name for name in amp.__all__ if name not in own]
    assert [n for n in passthrough if n not in served] == [], "a name served from paddle.amp is not in its table"


def test_every_api_entry_names_something_that_exists():
    import importlib

    for path in DIRECTIVE.findall(_api_text()):
        module, _, attr = path.rpartition(".")
        if path.startswith("paddle_amp_ext.integrations.paddle"):  # import PaddleNLP/PaddleFormers: not here
            continue
        try:
            target = importlib.import_module(path)
        except ImportError:
            target = getattr(importlib.import_module(module), attr, None)
        assert target is not None, f"docs/api names {path}, which does not exist"


def test_every_public_submodule_has_its_page():
    text = _api_text()
    for module in ("paddle_amp_ext.distributed", "paddle_amp_ext.run", "paddle_amp_ext.integrations.paddlenlp",
                   "paddle_amp_ext.integrations.paddleformers", "paddle_amp_ext.integrations.hapi",
                   "paddle_amp_ext.visualdl", "paddle_amp_ext.rehearsal", "paddle_amp_ext.debugging",
                   "paddle_amp_ext.verify", "paddle_amp_ext.fp8", "paddle_amp_ext.dashboards"):
        assert f"::: {module}" in text, module
    import paddle_amp_ext.dashboards as dashboards
    import paddle_amp_ext.distributed as distributed
    import paddle_amp_ext.fp8 as fp8
    import paddle_amp_ext.rehearsal as rehearsal
    import paddle_amp_ext.run as run
    import paddle_amp_ext.verify as verify
    import paddle_amp_ext.visualdl as visualdl

    documented = _documented()
    for sub in (dashboards, distributed, fp8, rehearsal, run, verify, visualdl):
        assert [n for n in sub.__all__ if n not in documented] == [], sub.__name__


def test_the_cli_page_renders_every_command_from_its_parser():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    page = (API / "cli.md").read_text(encoding="utf-8")
    assert sorted(cli.MARKER.findall(page)) == sorted(cli.COMMANDS)
    from paddle_amp_ext.cli import run

    rendered = cli.render("run")
    for action in run.build_parser()._actions:
        for flag in action.option_strings:
            assert f"`{flag}" in rendered, flag
    assert "| `--emulate EMULATE` |" in rendered and "`float16`, `bfloat16`" in rendered
    with pytest.raises(ValueError, match="unknown command 'nope' in a cli marker"):
        cli.on_page_markdown("<!-- cli: nope -->", type("P", (), {"file": type("F", (), {"src_path": "x.md"})})(),
                             None, None)


def test_the_readme_is_short_and_keeps_the_set_up_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "bash scripts/demo" in readme and "bash scripts/test" in readme
    assert "docs/loss_scale.png" in readme and "docs/dashboard.png" in readme
    for command in ("paddle_amp_ext.check", "paddle_amp_ext.run", "paddle_amp_ext.doctor",
                    "paddle_amp_ext.visualdl_serve"):
        assert command in readme, command


def test_the_readme_links_and_the_nav_point_at_pages_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\((docs/[^)#\s]+)", readme):
        assert (ROOT / target).exists(), target
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.MULTILINE):
        assert (DOCS / page).exists(), page


def test_the_changelog_page_includes_the_changelog_and_does_not_copy_it():
    page = (DOCS / "changelog.md").read_text(encoding="utf-8")
    assert page.strip() == '---\nsearch:\n  exclude: true\n---\n\n--8<-- "CHANGELOG.md"'  # not a search hit for every name


def _hook(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_hook_fails_the_build_when_the_parsers_cannot_be_built(monkeypatch):
    cli = _hook("cli")
    monkeypatch.setenv("PADDLE_AMP_EXT_DOCS_PYTHON", "/bin/false")
    with pytest.raises(RuntimeError, match=r"building the CLI parsers with /bin/false failed \(exit 1\)"):
        cli.render("check")


def test_the_skip_marker_becomes_a_note_on_the_page():
    examples = _hook("examples")
    page = "intro\n<!-- skip: needs a GPU -->\n```python\nx\n```\n"
    assert examples.on_page_markdown(page, None, None, None) == (
        "intro\n*Not run by the docs' tests: needs a GPU.*\n\n```python\nx\n```\n")


def test_the_sphinx_roles_become_optional_references():
    roles = _hook("roles")
    html = "see :func:<code>keep_fp32</code> and :class:<code>~paddle_amp_ext.AmpConfig</code>, :meth:<code>x()</code>"
    assert roles.on_page_content(html, None, None, None) == (
        'see <autoref identifier="paddle_amp_ext.keep_fp32" optional><code>keep_fp32</code></autoref> and '
        '<autoref identifier="paddle_amp_ext.AmpConfig" optional><code>AmpConfig</code></autoref>, '
        '<autoref identifier="paddle_amp_ext.x" optional><code>x()</code></autoref>')


def _output_hook(monkeypatch):
    monkeypatch.syspath_prepend(str(DOCS / "hooks"))  # as MkDocs loads its hooks: `from cli import ...`
    return _hook("output")


def test_the_output_hook_puts_the_real_output_on_the_page_and_fails_on_a_wrong_exit(monkeypatch):
    output = _output_hook(monkeypatch)
    monkeypatch.setenv("PADDLE_AMP_EXT_DOCS_PYTHON", sys.executable)
    page = output.on_page_markdown('a\n<!-- output: check --json --what-if "Tesla T4:7.5:16" -->\nb', None, None, None)
    assert page.startswith("a\n```json\n{") and page.endswith("}\n```\nb")
    assert '"name": "Tesla T4"' in page
    with pytest.raises(RuntimeError, match=r"`check --require fp64` exited 2, expected 0"):
        output.run("check", " --require fp64", 0)
    assert output.run("check", " --require fp64", 2) == ""  # exit=2 in the marker: the usage error is the point
    with pytest.raises(ValueError, match=r"unknown command 'rm'"):
        output.run("rm", " -rf /", 0)


def test_every_key_check_json_prints_is_explained_on_the_gate_page():
    import json
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", "--json", "--what-if", "Tesla T4:7.5:16"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    report = json.loads(proc.stdout)
    page = (DOCS / "gate.md").read_text(encoding="utf-8")
    table = page[page.index("## What `check` prints"):]
    table = table[:table.index("\n## ")]
    explained = set(re.findall(r"`(\w+)`", table))
    keys = set(report) | set(report["decision"]) | {k for d in report["devices"] for k in d}
    assert sorted(keys - explained) == []


# --------------------------------------------------------------- docs/hooks/docstrings.py

_PLANTED = '''
"""A package whose reference would render other than as written; see docs/x.md."""
from __future__ import annotations

from dataclasses import dataclass

from ._hidden import Hidden
from .helpers import Helper

__all__ = ["Good", "Record", "Shown", "Undocumented", "bad_returns", "good_returns"]


def good_returns() -> int:
    """Fine.

    Returns:
        A number, described on a line that goes on
            and on, indented.
    """
    return 1


def bad_returns() -> int:
    """Not fine.

    Returns:
        A number, described on a line that goes on
        and on, not indented.
    """
    return 1


def Undocumented() -> None:
    """In __all__, not on any page."""


class Good:
    """Fine."""

    @property
    def documented(self) -> int:
        """Documented."""
        return 1

    @property
    def bare(self) -> int:
        return 1


@dataclass
class Record:
    """A record.

    Attributes:
        described: described.
    """

    described: int
    undescribed: int


class Shown(Hidden, Helper):
    """A class with a private base and one the reference does not document."""
'''

_HELPERS = '''
class Helper:
    """A public module's class that is on no page."""
'''


def _docstrings_hook():
    pytest.importorskip("griffe", reason="griffe is in the [test] extra and docs/requirements.txt")
    return _hook("docstrings")


def test_the_docstrings_hook_finds_every_planted_rendering_problem(tmp_path):
    hook = _docstrings_hook()
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_PLANTED, encoding="utf-8")
    (pkg / "helpers.py").write_text(_HELPERS, encoding="utf-8")
    (pkg / "_hidden.py").write_text("class Hidden:\n    \"\"\"In a private module.\"\"\"\n", encoding="utf-8")
    directives = ["planted!members", "planted.good_returns", "planted.bad_returns", "planted.Good", "planted.Record",
                  "planted.Shown"]
    found = hook.problems("planted", directives, search_path=tmp_path)
    assert [line.split(" ", 1)[0] for line in found] == [
        "planted.Undocumented",
        "planted",
        "planted.bad_returns",
        "planted.Good.bare",
        "planted.Record",
        "planted.Shown",
        "planted.Shown",
    ], found
    assert "cites docs/x.md as text" in found[1]
    assert "its Returns: section renders as 2 items" in found[2]
    assert "a public property without a docstring" in found[3]
    assert "field 'undescribed' is not described" in found[4]
    assert "its base Hidden is private" in found[5]
    assert "its base planted.helpers.Helper is not in the API reference" in found[6]
    assert "'Bases: Helper', which names nothing" in found[6]
    # a module page that renders its members documents them
    assert "planted.Undocumented" not in " ".join(hook.problems("planted", ["planted"], search_path=tmp_path))
    # ``show_bases: false`` on the page hides the bases, and a documented base is fine
    hidden = hook.problems("planted", [d + "!bases" if d == "planted.Shown" else d for d in directives],
                           search_path=tmp_path)
    assert [line for line in hidden if line.startswith("planted.Shown ")] == []


def test_the_docstrings_hook_reads_the_pages_options():
    hook = _docstrings_hook()
    page = ("::: paddle_amp_ext.GradScaler\n    options:\n      show_bases: false\n\n::: paddle_amp_ext.route\n\n"
            "::: paddle_amp_ext.distributed\n    options:\n      members: false\n")
    found = [(path, bool(hook.NO_BASES.search(o)), bool(hook.NO_MEMBERS.search(o)))
             for path, o in hook.DIRECTIVE.findall(page)]
    assert found == [("paddle_amp_ext.GradScaler", True, False), ("paddle_amp_ext.route", False, False),
                     ("paddle_amp_ext.distributed", False, True)]
    assert "paddle_amp_ext.GradScaler!bases" in hook._directives()


def test_the_api_reference_renders_every_docstring_as_written():
    assert _docstrings_hook().problems() == []
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "  - docs/hooks/docstrings.py\n" in text, "the strict build runs the check"


def test_the_cli_and_distributed_packages_export_only_what_users_call():
    import paddle_amp_ext.cli as cli
    import paddle_amp_ext.distributed as distributed

    assert cli.__all__ == []
    assert distributed.__all__ == ["Layout", "SkipStrategy", "agree_found_inf", "flags_agree", "layout_of",
                                   "step_unless_nonfinite", "strategy_of"]
    from paddle_amp_ext.distributed import flags, norm

    # the plumbing stays importable from the package, as before
    assert (distributed.host_bool, distributed.all_reduce_max) == (flags.host_bool, flags.all_reduce_max)
    assert (distributed.norm_covers_every_grad, distributed.step_clipped) == (norm.norm_covers_every_grad,
                                                                              norm.step_clipped)


def test_every_command_has_one_name():
    """``python -m paddle_amp_ext.X`` is the console script ``paddle-amp-X`` is ``paddle_amp_ext.cli.X``."""
    import importlib.util

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert sorted(scripts) == ["paddle-amp-check", "paddle-amp-doctor", "paddle-amp-run", "paddle-amp-visualdl-serve"]
    for script, target in scripts.items():
        name = script[len("paddle-amp-"):].replace("-", "_")
        assert target == f"paddle_amp_ext.cli.{name}:main", script
        spec = importlib.util.find_spec(f"paddle_amp_ext.{name}")
        path = Path(spec.origin)
        entry = path.parent / "__main__.py" if path.name == "__init__.py" else path
        assert re.search(rf"^from \.+cli\.{name} import .*\bmain\b", entry.read_text(encoding="utf-8"), re.MULTILINE), entry
    assert not (ROOT / "paddle_amp_ext" / "cli" / "visualdl.py").exists()


def test_no_internal_tracker_numbers_in_code_tests_or_docs():
    """The tracker is not public: its numbers mean nothing to a reader (external references name
    their project, "Paddle #48321")."""
    tracker = re.compile(r"\b[Ii]ssues? ?#?" + r"\d+")
    found = []
    for folder in ("paddle_amp_ext", "tests", "benchmarks", "scripts", "examples", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".txt", ".yml", ".toml", "") and path.is_file() and "site" not in path.parts:
                text = path.read_text(encoding="utf-8", errors="replace")
                found += [f"{path.relative_to(ROOT)}:{m.group(0)}" for m in tracker.finditer(text)]
    found += [f"CHANGELOG.md:{m.group(0)}" for m in tracker.finditer((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))]
    assert found == []
