"""``scripts/ansi_to_html.py``, which turns ``wandb leet``'s tmux capture into the page the docs'
W&B screenshot is shot from: colours, attributes, escaping, and the codes it must drop."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ansi_to_html.py"
spec = importlib.util.spec_from_file_location("ansi_to_html", SCRIPT)
ansi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ansi)


def body(text: str) -> str:
    page = ansi.convert(text)
    return page[page.index("<pre>") + 5:page.index("</pre>")]


@pytest.mark.parametrize("index, colour", [
    (0, "#000000"), (15, "#ffffff"), (16, "#000000"), (210, "#ff8787"), (215, "#ffaf5f"), (231, "#ffffff"),
    (232, "#080808"), (238, "#444444"), (255, "#eeeeee"),
])
def test_palette_is_xterms(index, colour):
    assert ansi.palette(index) == colour


def test_colours_attributes_and_resets():
    assert body("\x1b[1m\x1b[38;5;255mRuns\x1b[0m \x1b[38;5;210mx\x1b[48;5;215my\x1b[39;49mz") == (
        '<span style="color:#eeeeee;font-weight:bold">Runs</span> <span style="color:#ff8787">x</span>'
        '<span style="color:#ff8787;background:#ffaf5f">y</span>z')
    assert body("\x1b[38;2;1;2;300mt\x1b[38;5;999mu") == (  # beyond 255: the brightest
        '<span style="color:#0102ff">t</span><span style="color:#eeeeee">u</span>')
    assert body("\x1b[31;42ma\x1b[91;102mb") == (
        '<span style="color:#cd3131;background:#0dbc79">a</span><span style="color:#f14c4c;background:#23d18b">b</span>')
    assert body("\x1b[7ma") == f'<span style="color:{ansi.BACKGROUND};background:{ansi.FOREGROUND}">a</span>'
    assert body("\x1b[1;2;3;4ma\x1b[22;23;24mb") == (
        '<span style="font-weight:bold;opacity:0.7;font-style:italic;text-decoration:underline">a</span>b')
    assert body("\x1b[ma\x1b[1mb\x1b[mc") == 'a<span style="font-weight:bold">b</span>c'  # empty SGR: reset


@pytest.mark.parametrize("text", ["\x1b[38;5ma", "\x1b[38ma", "\x1b[48;2;1;2ma", "\x1b[38;9;1ma", "\x1b[999ma"])
def test_truncated_and_unknown_codes_are_ignored(text):
    assert body(text) == "a"


def test_other_escapes_dropped_markup_escaped_braille_boxed():
    assert body("\x1b[?25l\x1b[2J\x1b]0;title\x07\x1b(B<b>&\r") == "&lt;b&gt;&amp;"
    assert body("\u2847x\u2500") == "<i>\u2847</i>x\u2500"  # Braille in a one-column box, box drawing as is
    assert body("") == ""


def test_command_line(tmp_path):
    (tmp_path / "in.ans").write_bytes(b"\x1b[38;5;210mamp/loss_scale\xff\x1b[0m\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "in.ans"), str(tmp_path / "out.html")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '<span style="color:#ff8787">amp/loss_scale\ufffd</span>' in (tmp_path / "out.html").read_text("utf-8")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "CAPTURE.ans PAGE.html" in proc.stderr
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing.ans"), str(tmp_path / "o.html")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "missing.ans" in proc.stderr
