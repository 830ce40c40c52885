"""The worked examples of docs/spec.md run against the broker.

Every ```pycon block of the page is a doctest; the blocks of one page share one namespace,
in order, as a reader would type them. A changed rule, or an edited number, fails here with
the page's line number. The suite runs on each backend (once compiled, once with
BURSARCORE_NO_EXTENSIONS=1), so the page holds for both.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```pycon\n(.*?)^```\n", re.S | re.M)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def pycon_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first line, its text) for every ```pycon block."""
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in FENCE.finditer(text)]


def run_examples(path: Path) -> tuple[int, int, str]:
    """Run a page's pycon blocks as one doctest: (failures, examples, report).

    Everything outside the blocks is blanked, so the blocks share one namespace and the
    report's line numbers are the page's."""
    text = path.read_text(encoding="utf-8")
    lines = [""] * (text.count("\n") + 1)
    for lineno, block in pycon_blocks(text):
        for i, line in enumerate(block.splitlines()):
            lines[lineno + i] = line
    test = doctest.DocTestParser().get_doctest("\n".join(lines), {}, path.name, str(path), 0)
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=out.append)
    failed, tried = runner.summarize(verbose=False)
    return failed, tried, "".join(out)


def test_pycon_blocks_are_found():
    text = "x\n```pycon\n>>> 1 + 1\n2\n```\n\n```python\n>>> no\n```\n```pycon\n>>> 3\n3\n```\n"
    assert pycon_blocks(text) == [(2, ">>> 1 + 1\n2\n"), (10, ">>> 3\n3\n")]


def test_a_wrong_number_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```pycon\n>>> x = 40 + 2\n>>> x\n41\n```\n", encoding="utf-8")
    failed, tried, report = run_examples(page)
    assert (failed, tried) == (1, 2)
    assert "line 3" in report and "41" in report


@pytest.mark.parametrize("page", ["spec.md"])
def test_worked_examples(page):
    path = DOCS / page
    failed, tried, report = run_examples(path)
    assert tried >= 40, f"{page}: only {tried} examples found"
    assert failed == 0, report
