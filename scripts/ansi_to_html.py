"""Turn a terminal capture (``tmux capture-pane -e -p``: text with SGR colour codes) into an HTML page.

Used by ``scripts/dashboard_screenshot`` to shoot ``wandb leet`` (a terminal UI) with headless
Chromium. Only the standard library; handles what tmux emits: bold, dim, italic, underline,
reverse, the 8/16 colours, the 256-colour palette and 24-bit colours, foreground and background.

    python scripts/ansi_to_html.py CAPTURE.ans PAGE.html
"""
from __future__ import annotations

import html
import re
import sys
from typing import Dict, List, Optional

SGR = re.compile(r"\x1b\[([0-9;:]*)m")
OTHER_ESCAPE = re.compile(r"\x1b(\[[0-9;?]*[A-Za-ln-z]|\][^\x07]*\x07|[()][A-Z0-9])")  # all but SGR
# characters the monospace font lacks (Braille, the charts' dots: DejaVu Sans has them, at its
# own width), each drawn in a box one column wide so the columns stay aligned
FOREIGN = re.compile(r"([\u2800-\u28ff])")
BASE16 = ["#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
          "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"]
FOREGROUND, BACKGROUND = "#d4d4d4", "#1a1a1a"


def rgb(red: int, green: int, blue: int) -> str:
    """``#rrggbb``."""
    return f"#{red:02x}{green:02x}{blue:02x}"


def palette(index: int) -> str:
    """The xterm 256-colour palette entry ``index`` as ``#rrggbb``."""
    if index < 16:
        return BASE16[index]
    if index < 232:
        levels = [0, 95, 135, 175, 215, 255]
        index -= 16
        return rgb(levels[index // 36], levels[index // 6 % 6], levels[index % 6])
    gray = 8 + 10 * (index - 232)
    return rgb(gray, gray, gray)


def apply_sgr(state: Dict[str, object], params: List[int]) -> None:
    """Update ``state`` (fg, bg, bold, dim, italic, underline, reverse) by one SGR sequence."""
    i = 0
    params = params or [0]
    while i < len(params):
        code = params[i]
        if code == 0:
            state.clear()
        elif code in (1, 2, 3, 4, 7):
            state[{1: "bold", 2: "dim", 3: "italic", 4: "underline", 7: "reverse"}[code]] = True
        elif code == 22:
            state.pop("bold", None)
            state.pop("dim", None)
        elif code in (23, 24, 27):
            state.pop({23: "italic", 24: "underline", 27: "reverse"}[code], None)
        elif 30 <= code <= 37 or 90 <= code <= 97:
            state["fg"] = BASE16[code - 30 if code < 90 else code - 82]
        elif 40 <= code <= 47 or 100 <= code <= 107:
            state["bg"] = BASE16[code - 40 if code < 100 else code - 92]
        elif code in (39, 49):
            state.pop("fg" if code == 39 else "bg", None)
        elif code in (38, 48):
            key = "fg" if code == 38 else "bg"
            if i + 2 < len(params) and params[i + 1] == 5:
                state[key] = palette(min(params[i + 2], 255))
                i += 2
            elif i + 4 < len(params) and params[i + 1] == 2:
                state[key] = rgb(*(min(v, 255) for v in params[i + 2:i + 5]))
                i += 4
            else:
                return  # a truncated or unknown colour form: the rest of the sequence is its arguments
        i += 1


def style(state: Dict[str, object]) -> Optional[str]:
    """The CSS of ``state``, or None for the default look."""
    fg, bg = state.get("fg"), state.get("bg")
    if state.get("reverse"):
        fg, bg = bg or BACKGROUND, fg or FOREGROUND
    css = []
    if fg:
        css.append(f"color:{fg}")
    if bg:
        css.append(f"background:{bg}")
    if state.get("bold"):
        css.append("font-weight:bold")
    if state.get("dim"):
        css.append("opacity:0.7")
    if state.get("italic"):
        css.append("font-style:italic")
    if state.get("underline"):
        css.append("text-decoration:underline")
    return ";".join(css) or None


def convert(text: str, title: str = "terminal") -> str:
    """The HTML page that shows ``text`` (a capture with SGR codes) as the terminal did."""
    text = OTHER_ESCAPE.sub("", text.replace("\r", ""))
    state: Dict[str, object] = {}
    out: List[str] = []
    pos = 0
    for match in list(SGR.finditer(text)) + [None]:
        end = match.start() if match else len(text)
        chunk = text[pos:end]
        if chunk:
            css = style(state)
            escaped = FOREIGN.sub(r'<i>\1</i>', html.escape(chunk))
            out.append(f'<span style="{css}">{escaped}</span>' if css else escaped)
        if match is None:
            break
        apply_sgr(state, [int(p) if p else 0 for p in re.split("[;:]", match.group(1))])
        pos = match.end()
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title) +
            "</title><style>html,body{margin:0;background:" + BACKGROUND + "}"
            "pre{margin:0;padding:8px;color:" + FOREGROUND + ";font:14px/1.15 'DejaVu Sans Mono',monospace}"
            "pre i{display:inline-block;width:1ch;font-style:normal;vertical-align:top;transform:scale(1.3,1.2)}"
            "</style></head><body><pre>" + "".join(out).rstrip("\n") + "</pre></body></html>\n")


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8", errors="replace") as f:
        page = convert(f.read(), title=argv[0])
    with open(argv[1], "w", encoding="utf-8") as f:
        f.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
