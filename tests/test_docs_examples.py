"""Every ```python block of README.md and docs/**/*.md runs.

Each block runs alone in a fresh subprocess of this Python (Paddle 3.3.1 in CI), in an empty
folder, with a timeout; a block that needs a GPU, fleet, a Trainer or a file that does not exist
is marked ``<!-- skip: REASON -->`` and the page says so (docs/hooks/examples.py). Run on Paddle
3.x only: the site documents 3.3.1, and each block costs a Paddle import on a shared CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import paddle
import pytest
from docs_blocks import ROOT, blocks, python_blocks

TIMEOUT = 240  # seconds per block: one Paddle import and a few tiny steps on a loaded 2-core machine
BLOCKS = python_blocks()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    return env


@pytest.mark.slow
@pytest.mark.skipif(int(paddle.__version__.split(".")[0]) < 3 and paddle.__version__ != "0.0.0",
                    reason="the docs' examples are checked on Paddle 3.x (the version the site documents)")
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.skip is None], ids=lambda b: f"{b.path}:{b.line}")
def test_the_block_runs(block, tmp_path):
    try:
        proc = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.path}:{block.line}: the block did not finish in {TIMEOUT} s")
    assert proc.returncode == 0, (f"{block.path}:{block.line} exited {proc.returncode}:\n{block.code}\n"
                                  f"--- stderr ---\n{proc.stderr[-4000:]}")


def test_the_pages_have_runnable_blocks_and_every_skip_says_why():
    run = [b for b in BLOCKS if b.skip is None]
    assert len(run) >= 15, f"only {len(run)} runnable python blocks in the docs"
    assert any(b.path == "README.md" for b in run), "the README's example must run"
    for b in BLOCKS:
        assert b.skip is None or len(b.skip) >= 8, f"{b.path}:{b.line}: say why it is skipped: {b.skip!r}"


def test_the_extractor(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("text\n\n<!-- skip: needs a GPU -->\n\n```python\nimport x\n```\n\n- item\n\n"
                    "    ```py\n    y = 1\n      z = 2\n    ```\n```bash\nls\n```\n")
    found = blocks(page, tmp_path)
    assert [(b.line, b.language, b.skip) for b in found] == [(5, "python", "needs a GPU"), (11, "py", None),
                                                            (15, "bash", None)]
    assert found[0].code == "import x\n" and found[1].code == "y = 1\n  z = 2\n"
    page.write_text("```python\nopen\n")
    with pytest.raises(ValueError, match=r"page\.md:1: a code block opened here is never closed"):
        blocks(page, tmp_path)
    page.write_text("<!-- skip: -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="a skip marker needs a reason"):
        blocks(page, tmp_path)
