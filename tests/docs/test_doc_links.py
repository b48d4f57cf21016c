"""Every relative link of the project's pages resolves: to a file or folder that exists, and for an
``#anchor`` to a heading of the page it names, under GitHub's rules (the heading's text, lower-case,
punctuation dropped, each space a '-', a repeated heading suffixed -1, -2, ...). Links inside code
(fenced blocks, `spans`) are not links and are not checked."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from repo_paths import REPO as ROOT


def _pages() -> list[Path]:
    pages = [
        *ROOT.glob("*.md"),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("examples/*.md"),
        *ROOT.glob("scripts/*.md"),
        *ROOT.glob("benchmarks/*.md"),
        *ROOT.glob("elmo_fast/**/*.md"),
        *ROOT.glob("tests/fixtures/**/*.md"),
    ]
    return sorted(set(pages))


PAGES = _pages()
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)


def _without_code(text: str) -> str:
    """The page with fenced blocks and code spans blanked (line numbers kept)."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text (links become their text, code loses its
    backticks), lower-case, every character that is not a letter, a digit, '_', '-' or a space dropped,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) renders as text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags render as nothing
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for m in _HEADING.finditer(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of each relative link on ``page``: not http(s), mailto or another scheme."""
    text = _without_code(page.read_text(encoding="utf-8"))
    out = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue
        out.append((text[: m.start()].count("\n") + 1, target))
    return out


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """Each link of ``page`` that does not resolve, said as 'FILE:LINE: target (why)'."""
    problems = []
    for line, target in links(page):
        path, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{line}: {target}"
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            problems.append(f"{where} (no such file: {dest})")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{where} (no heading of {dest.name} has the anchor #{anchor})")
        elif anchor and dest.suffix != ".md":
            problems.append(f"{where} (an anchor into a file that is not a page)")
    return problems


def test_the_pages_are_found_and_hold_links():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "RELIABILITY.md", "BENCHMARKS.md", "docs/coming-from-flair-seqvec.md"} <= names
    assert sum(len(links(p)) for p in PAGES) >= 20


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
    problems = broken(page)
    assert not problems, "links that do not resolve:\n" + "\n".join(problems)


def test_the_check_can_fail(tmp_path):
    assert (
        slug("Proteins: SeqVec's shape, from FASTA (`benchmarks/bench_proteins.py`; 48 proteins)")
        == "proteins-seqvecs-shape-from-fasta-benchmarksbench_proteinspy-48-proteins"
    )
    assert slug("Coming from allennlp / simple_elmo") == "coming-from-allennlp--simple_elmo"
    assert slug("[SeqVec](https://example.org) and `embed --fasta`") == "seqvec-and-embed---fasta"
    (tmp_path / "other.md").write_text("# Title\n## A B\n## A B\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](other.md#a-b-1) [ok](#page) [ok](other.md) [web](https://x.org/#nope)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n"
        "[bad](missing.md) [bad](other.md#a-b-2) [bad](#nowhere)\n",
        encoding="utf-8",
    )
    problems = broken(page, root=tmp_path)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == ["missing.md", "other.md#a-b-2", "#nowhere"]
    assert all(p.startswith("page.md:7: ") for p in problems)


def test_the_docs_ship_in_the_sdist():
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8")
    assert re.search(r"^graft docs$", manifest, re.M), "MANIFEST.in must graft docs/ (README.md links its pages)"


def test_every_docs_page_is_linked_from_the_readme():
    """A page of docs/ that the README does not link is a page nobody finds."""
    linked = {
        (ROOT / unquote(target.split("#")[0])).resolve()
        for _, target in links(ROOT / "README.md")
        if target and "://" not in target
    }
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "no docs/*.md found"
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"
