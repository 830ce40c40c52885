"""Every relative link in README.md and docs/**/*.md resolves inside the repository.

A link is ``[text](target)`` or a reference definition ``[label]: target`` outside code
(fenced blocks and inline code are text, not links). A target with a scheme (``https:``,
``mailto:``) is left alone: no network. Anything else must name a file or directory of the
repository, and a ``#fragment`` must be a heading of the Markdown file it points into (or of
the page itself), spelled as GitHub spells heading anchors.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for i, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
        elif fence is not None and m and m.group(1).startswith(fence):
            fence = None
        elif fence is None:
            yield i, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, with everything but
    letters, digits, ``_``, ``-`` and spaces removed and spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    keep = [ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN"]
    return "".join(keep).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeats get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(text: str):
    """(line number, target) of every link outside code."""
    for i, line in prose_lines(text):
        bare = INLINE_CODE.sub("", line)
        for m in INLINE_LINK.finditer(bare):
            yield i, m.group(1)
        m = REF_DEF.match(bare)
        if m:
            yield i, m.group(1)


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """What does not resolve among a page's links, one line each."""
    out = []
    for lineno, target in links(page.read_text(encoding="utf-8")):
        where = f"{page.relative_to(root)}:{lineno}: {target}"
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if root.resolve() not in (dest, *dest.parents):
            out.append(f"{where}: leaves the repository")
        elif not dest.exists():
            out.append(f"{where}: no such file")
        elif fragment and dest.suffix == ".md" and unquote(fragment) not in anchors(dest):
            out.append(f"{where}: no heading #{fragment} in {dest.relative_to(root.resolve())}")
    return out


def test_slugs_as_github_makes_them():
    assert slug("Pointing a broker at a Slurm partition") == "pointing-a-broker-at-a-slurm-partition"
    assert slug("§4.4–§4.6 Sizing, pending, lifecycle") == "4446-sizing-pending-lifecycle"   # an en dash is dropped
    assert slug("The broker as a service (`bursar serve`)") == "the-broker-as-a-service-bursar-serve"
    assert slug("4.1 Capacity (isolation)") == "41-capacity-isolation"


def test_checker_finds_what_is_broken(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n## Same\n## Same\n", encoding="utf-8")
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "# Top\n"
        "[ok](b.md#title) [ok2](b.md#same-1) [self](#top) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](b.md#nope) [out](../../elsewhere.md)\n"
        "`[in code](missing-too.md)`\n"
        "```\n[fenced](missing-three.md)\n```\n"
        "[ref]: b.md#same-2\n", encoding="utf-8")
    (tmp_path / "elsewhere.md").write_text("", encoding="utf-8")
    problems = broken(page, tmp_path)
    assert len(problems) == 4, problems
    assert "missing.md: no such file" in problems[0]
    assert "b.md#nope: no heading #nope" in problems[1]
    assert "../../elsewhere.md: leaves the repository" in problems[2]
    assert "b.md#same-2: no heading" in problems[3]


def test_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/spec.md", "docs/slurm.md", "docs/policy.md"} <= names


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves(page):
    assert broken(page) == []
