"""MkDocs hook: a code block that the docs' test does not run says so on the page.

``tests/test_docs_examples.py`` runs every ```` ```python ```` block of ``docs/**/*.md`` and
``README.md`` except those right after a ``<!-- skip: REASON -->`` comment. The comment is
invisible in Markdown, so this hook turns it into a visible note: "Not run by the docs' tests:
REASON."
"""

from __future__ import annotations

import re

SKIP = re.compile(r"^<!--\s*skip:\s*(.+?)\s*-->\s*$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return SKIP.sub(lambda m: f"*Not run by the docs' tests: {m.group(1)}.*\n", markdown)
