"""MkDocs hook: the command lines' options, rendered from their real argparse parsers.

A page holds ``<!-- cli: NAME -->`` (``check``, ``run``, ``doctor``, ``visualdl_serve``); the hook
replaces it with the command's usage line, description, a table of its options (flags, default,
choices, help) and its epilog, read from ``paddle_amp_ext.cli.<module>.build_parser()``.

Building a parser imports ``paddle_amp_ext``, which imports Paddle, and the docs venv has no
Paddle: the parsers are built in a subprocess of a Python that has it, named by
``PADDLE_AMP_EXT_DOCS_PYTHON``, else the repository's ``.venv`` (``scripts/docs`` sets it up),
else the Python running MkDocs. A parser that cannot be built fails the build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"check": "check", "run": "run", "doctor": "doctor", "visualdl_serve": "visualdl_serve"}
MARKER = re.compile(r"<!--\s*cli:\s*([A-Za-z_]+)\s*-->")

_DUMP = r"""
import argparse, importlib, json, sys  # noqa: E401
out = {}
for name, module in json.loads(sys.argv[1]).items():
    parser = importlib.import_module("paddle_amp_ext.cli." + module).build_parser()
    actions = []
    for a in parser._actions:
        actions.append({
            "flags": list(a.option_strings), "dest": a.dest, "metavar": a.metavar,
            "nargs": None if a.nargs is None else str(a.nargs),
            "choices": None if a.choices is None else [str(c) for c in a.choices],
            "default": None if a.default in (None, False, argparse.SUPPRESS) else repr(a.default),
            "help": a.help, "flag": a.nargs == 0,
        })
    out[name] = {"usage": parser.format_usage().strip(), "prog": parser.prog,
                 "description": parser.description, "epilog": parser.epilog, "actions": actions}
print(json.dumps(out))
"""

_cache: dict = {}


def _python() -> str:
    named = os.environ.get("PADDLE_AMP_EXT_DOCS_PYTHON")
    if named:
        return named
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def parsers() -> dict:
    """Every command's parser as plain data (built once per MkDocs run)."""
    if not _cache:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   PYTHONWARNINGS="ignore")
        proc = subprocess.run([_python(), "-c", _DUMP, json.dumps(COMMANDS)], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"docs/hooks/cli.py: building the CLI parsers with {_python()} failed "
                               f"(exit {proc.returncode}); set PADDLE_AMP_EXT_DOCS_PYTHON to a Python with Paddle "
                               f"and this package:\n{proc.stderr[-3000:]}")
        _cache.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return _cache


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(name: str) -> str:
    """Markdown for one command: usage, description, options table, epilog."""
    p = parsers()[name]
    lines = [f"```text\n{p['usage']}\n```", ""]
    if p["description"]:
        lines += [p["description"], ""]
    lines += ["| option | default | choices | what it does |", "|---|---|---|---|"]
    for a in p["actions"]:
        if a["flags"]:
            arg = "" if a["flag"] else " " + (a["metavar"] or a["dest"].upper())
            flag = ", ".join(f"`{f}{arg}`" for f in a["flags"])
        else:
            flag = f"`{a['metavar'] or a['dest']}`" + (" ..." if a["nargs"] == "..." else "")
        default = f"`{a['default']}`" if a["default"] else ""
        choices = ", ".join(f"`{c}`" for c in a["choices"]) if a["choices"] else ""
        lines.append(f"| {flag} | {default} | {choices} | {_cell(a['help'] or '')} |")
    if p["epilog"]:
        lines += ["", p["epilog"]]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in COMMANDS:
            raise ValueError(f"{page.file.src_path}: unknown command {name!r} in a cli marker; "
                             f"expected one of {sorted(COMMANDS)}")
        return render(name)

    return MARKER.sub(replace, markdown)
