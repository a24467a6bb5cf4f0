"""MkDocs hook: a command's real output on the page, run at build time.

A page holds ``<!-- output: check --what-if "Tesla T4:7.5:16" -->``; the hook runs
``python -m paddle_amp_ext.<command> <args>`` with the Python of ``docs/hooks/cli.py`` (one with
Paddle and this package) and puts what it printed on stdout in a ``text`` block (``json`` when the
arguments hold ``--json``). Only the package's own commands run, with arguments split as a shell
would; a command that exits with a code other than the one the marker names (``exit=N``, default
0) fails the build, so the page never shows a stale or broken output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile

from cli import ROOT, _python  # docs/hooks/ is on sys.path while MkDocs loads its hooks

MARKER = re.compile(r"<!--\s*output:\s*(?:exit=(\d+)\s+)?([a-z_]+)(.*?)-->")
COMMANDS = ("check", "doctor", "run", "visualdl_serve")
_cache: dict = {}


def run(command: str, args: str, expected: int) -> str:
    """What ``python -m paddle_amp_ext.COMMAND ARGS`` prints on stdout, run in an empty folder."""
    key = (command, args, expected)
    if key not in _cache:
        if command not in COMMANDS:
            raise ValueError(f"output marker: unknown command {command!r}; expected one of {COMMANDS}")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   PYTHONWARNINGS="ignore")
        with tempfile.TemporaryDirectory() as cwd:
            proc = subprocess.run([_python(), "-m", f"paddle_amp_ext.{command}", *shlex.split(args)], cwd=cwd,
                                  env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if proc.returncode != expected:
            raise RuntimeError(f"docs/hooks/output.py: `{command}{args}` exited {proc.returncode}, expected "
                               f"{expected}:\n{proc.stderr[-3000:]}")
        _cache[key] = proc.stdout.rstrip("\n")
    return _cache[key]


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        expected, command, args = int(match.group(1) or 0), match.group(2), match.group(3).rstrip()
        language = "json" if "--json" in shlex.split(args) else "text"
        return f"```{language}\n{run(command, args, expected)}\n```"

    return MARKER.sub(replace, markdown)
