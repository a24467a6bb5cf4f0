"""MkDocs hook: the docstrings' Sphinx roles (``:func:`keep_fp32```) as cross-references.

mkdocstrings' Google-style parser leaves ``:func:`X``` as the text ``:func:`` before the code
``X``. This hook turns each into an optional autorefs reference: a link where ``X`` (or
``paddle_amp_ext.X``) is documented on the site, plain code where it is not (a private module,
a method named without its class), never a broken link.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):<code>(~?)\.?([\w.]+)(\(\))?</code>")


def _reference(match: re.Match) -> str:
    short, name, call = match.group(1), match.group(2), match.group(3) or ""
    identifier = name if name.startswith("paddle_amp_ext") else f"paddle_amp_ext.{name}"
    shown = name.rsplit(".", 1)[-1] if short else name  # Sphinx's ~: the last component only
    return f'<autoref identifier="{identifier}" optional><code>{shown}{call}</code></autoref>'


def on_page_content(html: str, page, config, files) -> str:
    return ROLE.sub(_reference, html)
