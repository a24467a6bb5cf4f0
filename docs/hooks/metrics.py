"""MkDocs hook: the metrics tables, rendered from the registry (``paddle_amp_ext/dashboards/metrics.py``).

A page holds ``<!-- metrics-table -->`` (every metric: the AMP ones, then the FP8 family) or
``<!-- metrics-table:amp -->`` / ``<!-- metrics-table:fp8 -->`` (one family); the hook replaces
it with the registry's Markdown table. The registry imports only the standard library, so it is
loaded from its file (importing the package would import Paddle, which the docs venv lacks).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*metrics-table(?::(\w+))?\s*-->")


def registry():
    """The metrics module, loaded from its file."""
    spec = importlib.util.spec_from_file_location("_amp_metrics", ROOT / "paddle_amp_ext" / "dashboards" / "metrics.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown: str, **kwargs) -> str:
    if not MARKER.search(markdown):
        return markdown
    module = registry()
    return MARKER.sub(lambda match: module.markdown_table(match.group(1)), markdown)
