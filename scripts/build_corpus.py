#!/usr/bin/env python3
"""Build the English training corpus of elmo-fast's bundled model from Debian packages.

Every source is a Debian package (DFSG-free, from Debian's main archive) that holds real English
prose: dictionaries (GCIDE, WordNet, the Devil's Dictionary, FOLDOC, the Jargon File), the King
James Bible, fortune cookies, and the prose of manuals (Python, Linux kernel, Perl, Git, R, GNU
coding standards, Debian's guides). Install them (as root, offline from a Debian mirror)::

    apt-get update
    apt-get install -y --no-install-recommends \\
        dict-gcide wordnet-base dict-devil dict-foldoc dict-jargon bible-kjv bible-kjv-text \\
        fortunes fortunes-min python3.11-doc linux-doc-6.1 perl-doc git-doc r-doc-html \\
        gnu-standards debian-reference-en debian-handbook debian-policy developers-reference \\
        maint-guide abs-guide postgresql-doc-15 sqlite3-doc rust-doc python-django-doc \\
        python-sqlalchemy-doc python-flask-doc nodejs-doc cmake-doc

then build (about 10 minutes on one core)::

    python scripts/build_corpus.py --out corpus/all
    python scripts/build_corpus.py --permissive --out corpus/permissive

``--permissive`` takes only the sources whose text may be used under permissive or public-domain terms
(:data:`PERMISSIVE_SOURCES`; the bundled ``default`` model is trained on these), so that a model trained on
it carries no copyleft terms from its training text.

which writes ``train.txt`` and ``heldout.txt`` (one tokenized sentence per line, tokens separated
by single spaces, tokenized by :func:`elmo_fast.tokenizer.tokenize`), ``stats.json`` (per source:
package, version, licence, files, documents, sentences, tokens; totals; sha256 of the outputs;
vocabulary sizes and the most frequent tokens) and ``SOURCES.md`` (the same for people).

Pipeline, per source: locate the installed files (a missing package stops the build with a
one-line error naming it and the ``apt-get install`` command); extract plain prose paragraphs
(markup stripped per format: dictionary markup, HTML, POD; code blocks, tables, navigation and
headings dropped); split sentences (:func:`elmo_fast.tokenizer.split_sentences`); drop sentences
that are not prose (mostly non-letters, code-like, shouting, non-Latin); tokenize; keep
3..100 tokens; drop exact duplicates (across all sources: the first one met is kept). Each
sentence is put in the held-out split when the *group* it came from (a dictionary headword, a
documentation file, a Bible chapter, a fortune) hashes into the held-out share, so related
sentences stay on one side; a sentence that occurs on both sides is kept in train only. The
output is shuffled with a fixed seed. The same packages give byte-identical files.

``--limit-per-source N`` reads only the first N documents of each source (a quick check of the
whole pipeline, and what the tests use); ``--sources a,b`` builds from some sources only.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import html
import html.parser
import importlib.util
import json
import platform
import random
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


def _load_tokenizer():
    """elmo_fast.tokenizer, loaded from this checkout without importing the package (no torch)."""
    here = Path(__file__).resolve().parents[1] / "elmo_fast" / "tokenizer.py"
    if here.exists():
        spec = importlib.util.spec_from_file_location("_elmo_fast_tokenizer", here)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    from elmo_fast import tokenizer  # installed package

    return tokenizer


_tok = _load_tokenizer()
tokenize = _tok.tokenize
split_sentences = _tok.split_sentences

MIN_TOKENS = 3
MAX_TOKENS = 100
DEFAULT_SEED = 20240601
DEFAULT_HELDOUT_PERMILLE = 15  # 1.5 % of the groups


class MissingPackages(Exception):
    pass


# ==== documents ===================================================================================


@dataclass
class Doc:
    """One unit of a source: ``group`` decides its train/held-out side, ``paragraphs`` its text."""

    group: str
    paragraphs: list[str]


def _ws(text: str) -> str:
    return " ".join(text.split())


# ==== dict (dictd) files ==========================================================================

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _b64num(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64[c]
    return n


def dict_entries(index_path: Path, dict_path: Path) -> Iterator[tuple[str, str]]:
    """(headword, entry text) of a dictd database, one per distinct entry, in index order.

    Several index lines may point at one entry (variant spellings); it is given once, under its
    first headword. The ``00-database-*`` entries (the database's own description) are skipped.
    """
    data = gzip.open(dict_path).read()
    seen: set[tuple[int, int]] = set()
    with open(index_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith(("00-database", "00database")):
                continue
            loc = (_b64num(parts[1]), _b64num(parts[2]))
            if loc in seen:
                continue
            seen.add(loc)
            yield parts[0], data[loc[0] : loc[0] + loc[1]].decode("utf-8", errors="replace")


# ---- GCIDE ------------------------------------------------------------------------------------

# GCIDE writes accented letters as bracket codes: [=a] a-macron, [^a] a-circumflex, ['e] e-acute...
_GCIDE_DIACRITIC = {
    "=": "\u0304",
    "^": "\u0302",
    "'": "\u0301",
    "`": "\u0300",
    "~": "\u0303",
    ".": "\u0323",
    '"': "\u0308",
    ":": "\u0308",
    ",": "\u0327",
    "-": "\u0304",
    "_": "\u0331",
    "*": "",
    "+": "",
}
_GCIDE_CODE_RE = re.compile(r"\[([=^'`~.\":,\-_*+])([a-zA-Z])\]|\[([a-zA-Z])([=^'`~.\":,\-_])\]")
_GCIDE_LIGATURE_RE = re.compile(r"\[(ae|AE|oe|OE|th|TH|ng|NG|sec)\]")
_GCIDE_LIGATURES = {
    "ae": "\u00e6",
    "AE": "\u00c6",
    "oe": "\u0153",
    "OE": "\u0152",
    "th": "th",
    "TH": "Th",
    "ng": "ng",
    "NG": "Ng",
    "sec": "\u00a7",
}
# "--Shak.", "--Sir\n      W. Scott.": up to the next quote, source tag or blank line
_ATTRIBUTION_RE = re.compile(r"--\s?(?=[A-Z(])[^\"\[]*?(?=\n\s*\[|\n\s*\n|\"|$)")
_SOURCE_TAG_RE = re.compile(r"\[[^\[\]]*(?:Webster|WordNet|PJC|Century|Supp\.|Chambers|Johnson)[^\[\]]*\][^\n]*")
_BRACKETS_RE = re.compile(r"\[[^\[\]]*\]")
_HEADLINE_RE = re.compile(r"\\[^\\\n]*\\")
_POS_LINE_RE = re.compile(r"^\s*(?:(?:[a-z]{1,6}\.|&|or|pl\.?|p\.\s*p\.)\s*,?\s*)+$")
_SENSE_NUMBER_RE = re.compile(r"^\s*(?:\d+\.|\([a-z]\)|\([ivx]+\))\s*", re.M)


def _gcide_decode(text: str) -> str:
    def code(m: re.Match) -> str:
        mark, letter = (m.group(1), m.group(2)) if m.group(2) else (m.group(4), m.group(3))
        return unicodedata.normalize("NFC", letter + _GCIDE_DIACRITIC.get(mark, ""))

    text = _GCIDE_CODE_RE.sub(code, text)
    return _GCIDE_LIGATURE_RE.sub(lambda m: _GCIDE_LIGATURES[m.group(1)], text)


def gcide_paragraphs(entry: str) -> list[str]:
    """Prose of one GCIDE entry: definitions, notes and quotations, markup stripped.

    Drops the headword line(s) (``Bathe \\Bathe\\, v. t.``), pronunciations, etymologies and
    every other ``[...]`` group (source tags such as ``[1913 Webster]``, labels such as
    ``[Obs.]``), ``Syn:`` lists, sense numbers and quotation attributions (``--Shak.``); keeps the
    text of ``{cross references}`` and decodes GCIDE's accent codes (``Littr['e]`` -> Littré).
    """
    text = _SOURCE_TAG_RE.sub(" ", _gcide_decode(entry))  # tags, and stray headwords after them
    # brackets can nest one level ([Gr. {[alpha]}]); remove inner groups first
    for _ in range(3):
        new = _BRACKETS_RE.sub(" ", text)
        if new == text:
            break
        text = new
    lines = text.split("\n")
    i = 0
    while i < len(lines) and (not lines[i].strip() or "\\" in lines[i] or _POS_LINE_RE.match(lines[i])):
        i += 1
    text = "\n".join(lines[i:])
    text = _HEADLINE_RE.sub(" ", text)  # variant headwords further down
    text = re.sub(r"\{([^{}]*)\}", lambda m: re.sub(r"[*`\"]", "", m.group(1)), text)
    text = _ATTRIBUTION_RE.sub(" ", text)
    paragraphs = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para or para.startswith(("Syn:", "Syn.", "--Syn", "Syn ")):
            continue
        para = _SENSE_NUMBER_RE.sub("", para)
        para = re.sub(r"^Note:\s*", "", para)
        para = re.sub(r"\([^()]{0,40}\)", lambda m: "" if _is_label(m.group(0)) else m.group(0), para)
        para = _ws(para)
        if para:
            # glosses taken from WordNet 1.5 are lower-case: capitalised as WordNet's are
            paragraphs.append(para[0].upper() + para[1:] if para[0].islower() else para)
    return paragraphs


def _is_label(paren: str) -> bool:
    """Domain labels such as (Zool.), (Bot. & Med.), (Naut.): abbreviations only."""
    inner = paren[1:-1].strip()
    return bool(inner) and all(re.fullmatch(r"[A-Z][a-z]*\.|&|and|,", w) for w in inner.replace(",", " , ").split())


# ---- Devil's Dictionary, Jargon File, FOLDOC ------------------------------------------------------


def devil_paragraphs(entry: str) -> list[str]:
    """Prose of one Devil's Dictionary entry: the headword (``FORK, n.``) and verse credits dropped."""
    text = re.sub(r"^[A-Z][A-Z '\-.]*[A-Z.](?:,\s*(?:[a-z]{1,4}\.\s*)+|\.)?\s+", "", entry.lstrip(), count=1)
    text = re.sub(r"\[[A-Za-z]+\]", " ", text)  # [Latin]
    text = text.replace("_", "")  # _emphasis_
    paragraphs = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln for ln in para.split("\n") if not re.fullmatch(r"\s{20,}[A-Z][\w.' ]*", ln)]
        para = _ws(" ".join(lines))
        if para:
            paragraphs.append(para)
    return paragraphs


def jargon_paragraphs(entry: str) -> list[str]:
    """Prose of one Jargon File entry: headword, part of speech and pronunciation lines dropped."""
    paragraphs = []
    for k, para in enumerate(re.split(r"\n\s*\n", entry)):
        if k == 0:
            continue  # "crawling horror\n n." : headword, pronunciation, part of speech
        para = re.sub(r"\{\s*([^{}]*?)\s*\}", r"\1", para)
        para = re.sub(r"^\s*\[[^\[\]]*\]\s*", "", para)  # [Vancouver area]
        para = re.sub(r"^\s*\d+\.\s+", "", para)
        para = _ws(para)
        if para:
            paragraphs.append(para)
    return paragraphs


def foldoc_paragraphs(entry: str) -> list[str]:
    """Prose of one FOLDOC entry: the ``<category>`` tags, ``(date)`` lines, citations, URLs and
    ``/pronunciations/`` dropped; the text of ``{cross references}`` kept."""
    paragraphs = []
    for k, para in enumerate(re.split(r"\n\s*\n", entry)):
        if k == 0:
            continue  # the headword
        para = para.strip()
        if re.fullmatch(r"\(\d{4}-\d\d-\d\d\)", para) or para.startswith(("[", "{(", "Home:", "E-mail:")):
            continue
        para = re.sub(r"^<[^<>]*>\s*", "", para)
        para = re.sub(r"\{\(?(?:https?|ftp|news|mailto|gopher|telnet):[^{}]*\}", " ", para)
        para = re.sub(r"\{\s*([^{}]*?)\s*\}", r"\1", para)
        para = re.sub(r"\[[^\[\]]*\]", " ", para)
        para = re.sub(r"(?<!\w)/[^/\s][^/]{0,40}/(?!\w)", " ", para)  # /kom'pyoo-tron"/
        para = re.sub(r"^\s*\d+\.\s+", "", para)
        para = re.sub(r"(?<=\s)\d+\.\s+(?=[A-Z])", "", para)
        para = _ws(para)
        if para:
            paragraphs.append(para)
    return paragraphs


def entry_headword(entry: str) -> str | None:
    """The first headword written in an entry (``Boy \\Boy\\, n.`` -> ``boy``), lower-cased."""
    m = re.match(r"\s*([^\\\n]+?)\s*\\", entry)
    return m.group(1).lower() if m else None


def dict_source(stem: str, cleaner: Callable[[str], list[str]]) -> Callable[[dict], Iterator[Doc]]:
    def extract(paths: dict) -> Iterator[Doc]:
        for head, entry in dict_entries(paths["index"], paths["dict"]):
            # the group is the headword, shared with WordNet's lemmas: glosses GCIDE took from
            # WordNet land on the same side of the split
            yield Doc("lex:" + (entry_headword(entry) or head.lower()), cleaner(entry))

    return extract


# ---- WordNet ----------------------------------------------------------------------------------

_WN_QUOTE_RE = re.compile(r'"([^"]+)"')


def wordnet_synset(line: str) -> tuple[str, list[str]] | None:
    """(first lemma, [definition, examples...]) of one line of a WordNet ``data.*`` file.

    >>> wordnet_synset('00002 03 n 02 bath_towel 0 towel 0 000 | a large towel; "dry off with it"  ')
    ('bath towel', ['A large towel.', 'Dry off with it.'])
    """
    if line.startswith(" ") or "|" not in line:
        return None
    head, gloss = line.split("|", 1)
    fields = head.split()
    lemma = re.sub(r"\([a-z]+\)$", "", fields[4]).replace("_", " ")
    examples = [_ws(e) for e in _WN_QUOTE_RE.findall(gloss)]
    definition = _ws(re.split(r';?\s*"', gloss, maxsplit=1)[0]).rstrip(" ;")
    out = [s for s in [definition] + examples if s]
    return lemma, [_sentence_case(s) for s in out]


def _sentence_case(s: str) -> str:
    """'a large towel' -> 'A large towel.' (WordNet glosses and examples are lower-case fragments)."""
    s = s.strip()
    if s and s[0].islower():
        s = s[0].upper() + s[1:]
    if s and s[-1] not in ".!?" and not (len(s) > 1 and s[-1] in "\"')" and s[-2] in ".!?"):
        s += "."
    return s


def wordnet_docs(paths: dict) -> Iterator[Doc]:
    for path in paths["files"]:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parsed = wordnet_synset(line)
                if parsed:
                    lemma, sents = parsed
                    # each gloss or example is a sentence of its own: one paragraph each
                    yield Doc("lex:" + lemma.lower(), sents)


# ---- Bible ------------------------------------------------------------------------------------

_BIBLE_BOOKS = ("gen1:1-rev22:21",)


def bible_chapters(text: str) -> Iterator[tuple[str, str]]:
    """(chapter title, chapter text) from the output of ``bible gen1:1-rev22:21``."""
    title, verses = None, []
    for line in text.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            verses.append(m.group(1))
        elif re.match(r"^(?:[1-3] )?[A-Z][A-Za-z ]+ \d+$", line):
            if title and verses:
                yield title, " ".join(verses)
            title, verses = line.strip(), []
        else:
            verses.append(line)
    if title and verses:
        yield title, " ".join(verses)


def bible_docs(paths: dict) -> Iterator[Doc]:
    out = subprocess.run(
        [str(paths["program"]), *_BIBLE_BOOKS],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"},
    )
    for title, text in bible_chapters(out.stdout.decode("utf-8", errors="replace")):
        yield Doc("bible:" + title, [text])


# ---- fortunes ----------------------------------------------------------------------------------


def fortune_entries(text: str) -> list[str]:
    """The fortunes of one fortune file (``%`` lines separate them), attributions dropped."""
    out = []
    for block in re.split(r"^%\s*$", text, flags=re.M):
        lines = []
        for ln in block.split("\n"):
            if re.match(r"^\s*(?:--|\u2014|- )\s*\S", ln) or re.match(r"^\s{12,}\S", ln):
                break  # "-- Mark Twain", or an indented credit: the rest is attribution
            lines.append(ln)
        para = _ws(" ".join(lines))
        if para:
            out.append(para)
    return out


def fortune_docs(paths: dict) -> Iterator[Doc]:
    for path in paths["files"]:
        text = path.read_bytes().decode("utf-8", errors="replace")
        for k, fortune in enumerate(fortune_entries(text)):
            yield Doc(f"fortune:{path.name}:{k}", [fortune])


# ---- HTML ---------------------------------------------------------------------------------------

_BLOCK_TAGS = frozenset(
    "p div li dd dt ul ol dl blockquote section article aside main header footer nav table tr td th "
    "h1 h2 h3 h4 h5 h6 pre figure figcaption caption br hr form body html head title center".split()
)
_SKIP_TAGS = frozenset(
    "pre script style table nav head title h1 h2 h3 h4 h5 h6 dt form select button textarea svg math sup".split()
)
_SKIP_CLASSES = frozenset(
    "highlight sphinxsidebar sphinxsidebarwrapper related footer header navheader navfooter toc "
    "breadcrumbs headerlink programlisting screen synopsis literallayout cmdsynopsis funcsynopsis "
    "example-contents informalexample literal-block doctest code-block toctree-wrapper contents "
    "topic sidebar navigation nav-menu navbar versionmodified footnote footnote-reference "
    "citation legalnotice copyright revhistory index indextable genindex glossterm mw-editsection "
    "example verbatim lisp smallexample display format smalldisplay".split()
)
_VOID_TAGS = frozenset("area base br col embed hr img input link meta param source track wbr".split())


class _ProseParser(html.parser.HTMLParser):
    """Paragraph texts of an HTML page: block elements separate paragraphs; code, tables,
    navigation, headings and definition terms are skipped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []  # (tag, skipping)
        self.buf: list[str] = []
        self.paragraphs: list[str] = []

    def _skipping(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def _flush(self) -> None:
        if self.buf:
            text = _ws("".join(self.buf))
            if text:
                self.paragraphs.append(text)
            self.buf = []

    def handle_starttag(self, tag, attrs):
        if tag in _BLOCK_TAGS:
            self._flush()
        if tag in _VOID_TAGS:
            return
        classes = set()
        role = None
        for k, v in attrs:
            if k == "class" and v:
                classes.update(v.split())
            elif k == "role":
                role = v
        skip = (
            self._skipping()
            or tag in _SKIP_TAGS
            or bool(classes & _SKIP_CLASSES)
            or (tag == "dl" and bool(classes & {"c", "cpp"}))  # C API entries (kernel-doc)
            or any(c.startswith(("highlight", "sphinxsidebar")) for c in classes)
            or role in ("navigation", "search", "banner", "contentinfo")
        )
        self.stack.append((tag, skip))

    def handle_startendtag(self, tag, attrs):
        if tag in _BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag):
        if tag in _BLOCK_TAGS:
            self._flush()
        if tag in _VOID_TAGS:
            return
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        if not self._skipping():
            self.buf.append(data)

    def close(self):
        super().close()
        self._flush()


def html_paragraphs(page: str) -> list[str]:
    """Prose paragraphs of an HTML page (see :class:`_ProseParser`).

    >>> html_paragraphs('<h1>T</h1><p>One <code>x</code> two.</p><pre>code()</pre><p>Three&amp;four</p>')
    ['One x two.', 'Three&four']
    """
    p = _ProseParser()
    p.feed(page)
    p.close()
    return [t.replace("\u00b6", "").strip() for t in p.paragraphs]


def html_docs(paths: dict) -> Iterator[Doc]:
    root: Path = paths["root"]
    for path in paths["files"]:
        page = path.read_bytes().decode("utf-8", errors="replace")
        yield Doc(f"file:{path.relative_to(root)}", html_paragraphs(page))


# ---- POD (Perl documentation) ------------------------------------------------------------------

_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&", "apos": "'"}


def _pod_escape(name: str) -> str:
    if name.isdigit():
        return chr(int(name))
    if name.lower().startswith("0x"):
        return chr(int(name, 16))
    if name in _POD_ESCAPES:
        return _POD_ESCAPES[name]
    return html.unescape(f"&{name};")


def _pod_link(body: str) -> str:
    if "|" in body:
        return body.split("|", 1)[0]
    if "/" in body:
        page, sec = body.split("/", 1)
        sec = sec.strip('"')
        return f"{sec} in {page}" if page else sec
    return body.strip('"')


def pod_inline(text: str) -> str:
    """POD formatting codes to plain text: ``C<x>``, ``B<< x >>``, ``L<text|page>``, ``E<gt>``.

    >>> pod_inline('Use C<< $a <=> $b >> or L<sort|perlfunc/sort>, see L<perlop/"Equality">E<gt>')
    'Use $a <=> $b or sort, see Equality in perlop>'
    """
    text = re.sub(r"[A-Z]<<+\s+(.*?)\s+>>+", lambda m: m.group(1), text, flags=re.S)
    for _ in range(6):
        new = re.sub(r"([A-Z])<([^<>]*)>", lambda m: _pod_code(m.group(1), m.group(2)), text)
        if new == text:
            break
        text = new
    return text


def _pod_code(code: str, body: str) -> str:
    if code == "E":
        return _pod_escape(body)
    if code in "XZ":
        return ""
    if code == "L":
        return _pod_link(body)
    return body


def pod_paragraphs(pod: str) -> list[str]:
    """Prose paragraphs of a POD document: verbatim (indented) paragraphs, commands and
    ``=begin``/``=for`` blocks dropped; ``=item`` text kept when it is not a bare marker."""
    out = []
    in_pod, skip_block = False, None
    for para in re.split(r"\n[ \t]*\n", pod):
        if not para.strip():
            continue
        if para.startswith("="):
            cmd = para.split(None, 1)[0]
            if cmd == "=cut":
                in_pod = False
                continue
            in_pod = True
            if cmd == "=begin":
                skip_block = (para.split() + [""])[1]
            elif cmd == "=end":
                skip_block = None
            elif cmd == "=item" and not skip_block:
                rest = para[len(cmd) :].strip()
                rest = re.sub(r"^(?:\*|\d+\.?)\s*", "", rest)
                if len(rest.split()) >= 4:
                    out.append(_ws(pod_inline(rest)))
            continue
        if skip_block or para[0] in " \t":
            continue
        if not in_pod:
            continue  # code between =cut and the next command
        out.append(_ws(pod_inline(para)))
    return [p for p in out if p]


def pod_docs(paths: dict) -> Iterator[Doc]:
    root: Path = paths["root"]
    for path in paths["files"]:
        text = path.read_bytes().decode("utf-8", errors="replace")
        yield Doc(f"file:{path.relative_to(root)}", pod_paragraphs(text))


# ==== sentence filters ============================================================================

_WORD_RE = re.compile(r"^(?=.*[^\W\d_])[^\W_]+(?:[-'\u2019.][^\W_]+)*\.?$")  # UTF-8, 2x, e.g.
_NUMBER_RE = re.compile(r"^\d+(?:[.,:]\d+)*(?:st|nd|rd|th|s)?$")
_PUNCT = frozenset(
    list(",.;:!?\"'()-\u2019\u2018\u201c\u201d\u2026") + ["...", "--", "n't", "'s", "'re", "'ll", "'ve", "'m", "'d"]
)
_ASCII_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_OPENING = frozenset(["(", "[", '"', "'", "\u2018", "\u201c", "``"])
_CLOSING = frozenset([")", "]", '"', "'", "\u2019", "\u201d", "''"])
_TERMINAL = frozenset([".", "!", "?", ":", "...", "\u2026"])
_CODE_CHARS = frozenset("_=<>{}|\\~^*#$@`[]")


def _is_identifier(tok: str) -> bool:
    """A dotted name that is no abbreviation (``os.path``, ``master.conf``) or a path."""
    if tok.startswith("/") or tok.count("/") > 1:
        return True
    return bool(re.search(r"[a-z]\.[a-z]", tok)) and not re.fullmatch(r"(?:[a-zA-Z]\.)+", tok)


def sentence_tokens(sentence: str) -> list[str] | None:
    """The tokens of ``sentence`` if it reads as English prose, else None.

    Typographic quotes and apostrophes are made ASCII first (``’s`` -> ``'s``, ``“`` -> ``"``),
    as in ELMo's training data, so that one word is one vocabulary entry.

    Rejects: fewer than 3 or more than 100 tokens; a first word not capitalised (nor a number);
    no terminal punctuation (``. ! ? : ...``, possibly inside closing quotes or brackets); more
    than 3 % of the characters code-like (``_=<>{}|\\~^*#$@`[]``); more than 10 % of the tokens
    identifiers, paths or ``( )`` pairs; fewer than 70 % of the tokens words, numbers or ordinary
    punctuation; fewer than 60 % of the non-space characters letters; more than half of the
    words in capitals; letters outside the Latin script; no lower-case word at all.
    """
    sentence = sentence.translate(_ASCII_QUOTES)
    chars = "".join(sentence.split())
    if not chars:
        return None
    letters = sum(c.isalpha() for c in chars)
    if letters < 0.6 * len(chars):
        return None
    if sum(c in _CODE_CHARS for c in chars) > 0.03 * len(chars):
        return None
    if any(c.isalpha() and ord(c) > 0x24F and not (0x1E00 <= ord(c) <= 0x1EFF) for c in chars):
        return None
    toks = tokenize(sentence)
    n = len(toks)
    if n < MIN_TOKENS or n > MAX_TOKENS:
        return None
    # a sentence starts with a capital or a digit (after opening quotes or brackets) and ends with
    # terminal punctuation: this drops headings, captions, list fragments and broken paragraphs
    first = next((t for t in toks if t not in _OPENING), "")
    if not (first[:1].isupper() or first[:1].isdigit()):
        return None
    k = n - 1
    while k > 0 and toks[k] in _CLOSING:
        k -= 1
    if not (toks[k] in _TERMINAL or (toks[k].endswith(".") and len(toks[k]) > 1)):
        return None
    words = [t for t in toks if _WORD_RE.match(t)]
    ok = len(words) + sum(1 for t in toks if t in _PUNCT or _NUMBER_RE.match(t))
    if ok < 0.7 * n:
        return None
    caps = sum(1 for w in words if len(w) > 1 and w.isupper())
    if caps > 0.5 * max(len(words), 1) or not any(w[0].islower() for w in words):
        return None
    # identifiers: dotted names that are not abbreviations (os.path.join), CamelCase with digits
    code = sum(1 for t in toks if _is_identifier(t))
    code += sum(1 for i in range(n - 1) if toks[i] == "(" and toks[i + 1] == ")")
    if code > max(1, 0.1 * n):
        return None
    return toks


def prose_sentences(paragraphs: Iterable[str]) -> Iterator[list[str]]:
    for para in paragraphs:
        for s in split_sentences(para):
            toks = sentence_tokens(s)
            if toks is not None:
                yield toks


# ==== sources =====================================================================================


@dataclass
class Source:
    name: str
    package: str
    licence: str
    description: str
    locate: Callable[[], dict]  # -> {"files": [...], ...}; raises MissingPackages
    extract: Callable[[dict], Iterator[Doc]]
    extra_packages: tuple[str, ...] = ()
    copyright_package: str | None = None


def _need(path: Path, package: str) -> Path:
    if not path.exists():
        raise MissingPackages(package)
    return path


def _dict_paths(stem: str, package: str) -> Callable[[], dict]:
    def locate() -> dict:
        d = Path("/usr/share/dictd")
        return {
            "index": _need(d / f"{stem}.index", package),
            "dict": _need(d / f"{stem}.dict.dz", package),
            "files": [d / f"{stem}.index", d / f"{stem}.dict.dz"],
        }

    return locate


def _glob_paths(
    package: str, root: str, patterns: Iterable[str], exclude: str | None = None, sentinel: str | None = None
) -> Callable[[], dict]:
    def locate() -> dict:
        r = _need(Path(root), package)
        if sentinel:
            _need(r / sentinel, package)
        files = sorted({p for pat in patterns for p in r.glob(pat) if p.is_file()})
        if exclude:
            rx = re.compile(exclude)
            files = [p for p in files if not rx.search(str(p.relative_to(r)))]
        if not files:
            raise MissingPackages(package)
        return {"root": r, "files": files}

    return locate


def _wordnet_locate() -> dict:
    d = Path("/usr/share/wordnet")
    files = [_need(d / f"data.{pos}", "wordnet-base") for pos in ("noun", "verb", "adj", "adv")]
    return {"files": files}


def _bible_locate() -> dict:
    _need(Path("/usr/lib/bible.data"), "bible-kjv-text")
    return {"program": _need(Path("/usr/bin/bible"), "bible-kjv"), "files": [Path("/usr/lib/bible.data")]}


FORTUNES_MIN_FILES = ("fortunes", "literature", "riddles")
FORTUNES_FILES = (
    "art",
    "computers",
    "cookie",
    "debian",
    "definitions",
    "disclaimer",
    "drugs",
    "education",
    "ethnic",
    "food",
    "goedel",
    "humorists",
    "kids",
    "knghtbrd",
    "law",
    "linux",
    "linuxcookie",
    "love",
    "magic",
    "medicine",
    "men-women",
    "miscellaneous",
    "news",
    "paradoxum",
    "people",
    "pets",
    "platitudes",
    "politics",
    "pratchett",
    "science",
    "songs-poems",
    "sports",
    "startrek",
    "tao",
    "wisdom",
    "work",
    "zippy",
)  # left out: ascii-art (pictures), perl (code), translate-me (other languages)


def _fortune_locate(package: str, names: tuple[str, ...]) -> Callable[[], dict]:
    def locate() -> dict:
        d = Path("/usr/share/games/fortunes")
        return {"files": [_need(d / n, package) for n in names]}

    return locate


SOURCES: list[Source] = [
    Source(
        "gcide",
        "dict-gcide",
        "GPL-2+",
        "GNU Collaborative International Dictionary of English: definitions, notes and literary "
        "quotations (Webster's 1913 with WordNet 1.5 additions)",
        _dict_paths("gcide", "dict-gcide"),
        dict_source("gcide", gcide_paragraphs),
    ),
    Source(
        "wordnet",
        "wordnet-base",
        "WordNet-3.0 (Princeton; BSD-like, DFSG-free)",
        "WordNet 3.0 glosses and example sentences",
        _wordnet_locate,
        wordnet_docs,
    ),
    Source(
        "devil",
        "dict-devil",
        "public domain",
        "Ambrose Bierce, The Devil's Dictionary (1911)",
        _dict_paths("devil", "dict-devil"),
        dict_source("devil", devil_paragraphs),
    ),
    Source(
        "jargon",
        "dict-jargon",
        "public domain",
        "The Jargon File 4.4.7 (hacker slang lexicon)",
        _dict_paths("jargon", "dict-jargon"),
        dict_source("jargon", jargon_paragraphs),
    ),
    Source(
        "foldoc",
        "dict-foldoc",
        "GFDL-1.1+ (no invariant sections)",
        "Free On-line Dictionary of Computing",
        _dict_paths("foldoc", "dict-foldoc"),
        dict_source("foldoc", foldoc_paragraphs),
    ),
    Source(
        "bible",
        "bible-kjv-text",
        "public domain (KJV text); GPL-2+ (bible-kjv program)",
        "King James Version of the Bible (1611), read with the bible-kjv program",
        _bible_locate,
        bible_docs,
        extra_packages=("bible-kjv",),
    ),
    Source(
        "fortunes-min",
        "fortunes-min",
        "BSD (fortune-mod); quotations of varied origin",
        "fortune cookies: fortunes, literature, riddles",
        _fortune_locate("fortunes-min", FORTUNES_MIN_FILES),
        fortune_docs,
    ),
    Source(
        "fortunes",
        "fortunes",
        "BSD (fortune-mod); quotations of varied origin",
        "fortune cookies: quotations and jokes (the non-offensive set)",
        _fortune_locate("fortunes", FORTUNES_FILES),
        fortune_docs,
    ),
    Source(
        "python-doc",
        "python3.11-doc",
        "PSF-2.0",
        "Python 3.11 documentation (tutorial, library and language reference, HOWTOs)",
        _glob_paths(
            "python3.11-doc",
            "/usr/share/doc/python3.11/html",
            ["**/*.html"],
            exclude=r"^(_static|_sources|_images)/|(^|/)(genindex[^/]*|search|py-modindex|"
            r"changelog|copyright|license|bugs|download)\.html$",
        ),
        html_docs,
    ),
    Source(
        "linux-doc",
        "linux-doc-6.1",
        "GPL-2",
        "Linux kernel 6.1 documentation (admin guide, process, subsystem and driver docs)",
        _glob_paths(
            "linux-doc-6.1",
            "/usr/share/doc/linux-doc-6.1/html",
            ["**/*.html"],
            exclude=r"^(translations|_static|_sources|_images|_downloads)/|"
            r"(^|/)(genindex|search)\.html$",
        ),
        html_docs,
    ),
    Source(
        "perl-doc",
        "perl-doc",
        "GPL-1+ or Artistic",
        "Perl 5.36 manual pages in POD (perlfaq, perlfunc, perlop, tutorials, deltas)",
        _glob_paths("perl-doc", "/usr/share/perl/5.36.0/pod", ["*.pod"]),
        pod_docs,
    ),
    Source(
        "git-doc",
        "git-doc",
        "GPL-2",
        "Git 2.39 documentation (manual pages, user manual, how-tos)",
        _glob_paths(
            "git-doc",
            "/usr/share/doc/git-doc",
            ["*.html", "howto/*.html", "technical/*.html"],
            exclude=r"(^|/)(RelNotes|index)",
        ),
        html_docs,
    ),
    Source(
        "r-doc",
        "r-doc-html",
        "GPL-2+",
        "R manuals (An Introduction to R, R Language Definition, Writing R Extensions, FAQ...)",
        _glob_paths("r-doc-html", "/usr/share/R/doc/manual", ["*.html"], sentinel="R-intro.html"),
        html_docs,
    ),
    Source(
        "gnu-standards",
        "gnu-standards",
        "GFDL-1.3+ (no invariant sections)",
        "GNU Coding Standards and Information for Maintainers of GNU Software",
        _glob_paths("gnu-standards", "/usr/share/doc/gnu-standards", ["standards.html", "maintain.html"]),
        html_docs,
    ),
    Source(
        "debian-reference",
        "debian-reference-en",
        "GPL-2+",
        "Debian Reference (English)",
        _glob_paths("debian-reference-en", "/usr/share/debian-reference", ["*.en.html"]),
        html_docs,
    ),
    Source(
        "debian-handbook",
        "debian-handbook",
        "GPL-2+ or CC-BY-SA-3.0",
        "The Debian Administrator's Handbook (English)",
        _glob_paths("debian-handbook", "/usr/share/doc/debian-handbook/html/en-US", ["*.html"]),
        html_docs,
    ),
    Source(
        "debian-policy",
        "debian-policy",
        "GPL-2+",
        "Debian Policy Manual and related documents",
        _glob_paths(
            "debian-policy",
            "/usr/share/doc/debian-policy",
            ["*.html", "policy.html/*.html"],
            exclude=r"(^|/)(genindex|search|README)\.html$",
        ),
        html_docs,
    ),
    Source(
        "developers-reference",
        "developers-reference",
        "GPL-2",
        "Debian Developer's Reference",
        _glob_paths(
            "developers-reference",
            "/usr/share/developers-reference",
            ["*.html"],
            exclude=r"(^|/)(genindex|search)\.html$",
        ),
        html_docs,
    ),
    Source(
        "maint-guide",
        "maint-guide",
        "GPL-2+ or MIT",
        "Debian New Maintainers' Guide (English)",
        _glob_paths("maint-guide", "/usr/share/doc/maint-guide/html", ["*.en.html"]),
        html_docs,
    ),
    Source(
        "abs-guide",
        "abs-guide",
        "public domain",
        "Advanced Bash-Scripting Guide (prose only; code examples dropped)",
        _glob_paths("abs-guide", "/usr/share/doc/abs-guide/html", ["*.html"]),
        html_docs,
    ),
]
SOURCES += [
    Source(
        "postgresql-doc",
        "postgresql-doc-15",
        "PostgreSQL (permissive, MIT-like)",
        "PostgreSQL 15 manual (tutorial, SQL language, server administration, internals)",
        _glob_paths("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html", ["*.html"], exclude=r"^bookindex"),
        html_docs,
    ),
    Source(
        "sqlite-doc",
        "sqlite3-doc",
        "public domain",
        "SQLite documentation (language, file format, design notes, how-tos)",
        _glob_paths(
            "sqlite3-doc",
            "/usr/share/doc/sqlite3",
            ["*.html", "**/*.html"],
            exclude=r"(^|/)(sitemap|keyword_index|toc)\.html$",
        ),
        html_docs,
    ),
    Source(
        "rust-books",
        "rust-doc",
        "MIT or Apache-2.0",
        "The Rust Programming Language, the Rust Reference, the Rustonomicon, Rust by Example, the Edition Guide",
        _glob_paths(
            "rust-doc",
            "/usr/share/doc/rust-doc/html",
            [f"{book}/**/*.html" for book in ("book", "reference", "nomicon", "rust-by-example", "edition-guide")],
            exclude=r"^book/(2018-edition|first-edition|second-edition)/|(^|/)(print|toc|404|SUMMARY)\.html$",
        ),
        html_docs,
    ),
    Source(
        "django-doc",
        "python-django-doc",
        "BSD-3-Clause",
        "Django documentation (tutorials, topic guides, reference, how-tos)",
        _glob_paths(
            "python-django-doc",
            "/usr/share/doc/python-django-doc/html",
            ["**/*.html"],
            exclude=r"^(_modules|_static|_images|releases)/|(^|/)(genindex|search|py-modindex)\.html$",
        ),
        html_docs,
    ),
    Source(
        "sqlalchemy-doc",
        "python-sqlalchemy-doc",
        "MIT (Expat)",
        "SQLAlchemy documentation (tutorials, ORM and Core guides)",
        _glob_paths(
            "python-sqlalchemy-doc",
            "/usr/share/doc/python-sqlalchemy-doc/html",
            ["**/*.html"],
            exclude=r"^(_modules|_static|_images|changelog)/|(^|/)(genindex|search|py-modindex)\.html$",
        ),
        html_docs,
    ),
    Source(
        "flask-doc",
        "python-flask-doc",
        "BSD-3-Clause",
        "Flask documentation (tutorial, patterns, API prose)",
        _glob_paths(
            "python-flask-doc",
            "/usr/share/doc/python-flask-doc/html",
            ["**/*.html"],
            exclude=r"^(_modules|_static|_images)/|(^|/)(genindex|search|py-modindex|changes|license)\.html$",
        ),
        html_docs,
    ),
    Source(
        "nodejs-doc",
        "nodejs-doc",
        "MIT (Expat)",
        "Node.js API documentation",
        _glob_paths("nodejs-doc", "/usr/share/doc/nodejs/api", ["*.html"], exclude=r"^(all|index)\.html$"),
        html_docs,
    ),
    Source(
        "cmake-doc",
        "cmake-doc",
        "BSD-3-Clause",
        "CMake documentation (manual pages, guides)",
        _glob_paths(
            "cmake-doc",
            "/usr/share/doc/cmake-doc/html",
            ["**/*.html"],
            exclude=r"^(_static|_sources|release)/|(^|/)(genindex|search)\.html$",
        ),
        html_docs,
    ),
]
SOURCE_BY_NAME = {s.name: s for s in SOURCES}

#: The sources whose text may be used under permissive or public-domain terms (for dual-licensed ones, the
#: permissive choice: perl-doc under the Artistic licence, maint-guide under MIT). A model trained on these
#: alone carries no copyleft terms from its training text. The other sources are GPL or GFDL (or quotations
#: of varied origin: the fortunes).
PERMISSIVE_SOURCES = (
    "wordnet",
    "devil",
    "jargon",
    "bible",
    "python-doc",
    "perl-doc",
    "abs-guide",
    "maint-guide",
    "postgresql-doc",
    "sqlite-doc",
    "rust-books",
    "django-doc",
    "sqlalchemy-doc",
    "flask-doc",
    "nodejs-doc",
    "cmake-doc",
)


# ==== package metadata ============================================================================


def package_version(package: str) -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True, check=False
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def copyright_summary(package: str) -> dict:
    """The ``License:`` names of a package's Debian copyright file, and the file's sha256."""
    path = Path("/usr/share/doc") / package / "copyright"
    if not path.exists():
        return {"file": str(path), "licenses": [], "sha256": None}
    text = path.read_text(encoding="utf-8", errors="replace")
    names = []
    for m in re.finditer(r"^License:[ \t]*(\S.*)$", text, re.M):
        if m.group(1).strip() not in names:
            names.append(m.group(1).strip())
    if not names:
        for phrase in (
            "public domain",
            "GNU General Public License",
            "GNU Free Documentation License",
            "BSD",
            "Artistic",
        ):
            if phrase.lower() in text.lower():
                names.append(phrase)
    return {"file": str(path), "licenses": names, "sha256": hashlib.sha256(text.encode()).hexdigest()}


# ==== the build ===================================================================================


def heldout_group(group: str, permille: int) -> bool:
    """Whether a group goes to the held-out split: a stable hash (sha1) of its key."""
    h = int.from_bytes(hashlib.sha1(group.encode("utf-8")).digest()[:8], "big")
    return h % 1000 < permille


@dataclass
class SourceStats:
    name: str
    package: str
    version: str
    licence: str
    description: str
    copyright: dict
    files: int
    documents: int = 0
    candidates: int = 0  # sentences that passed the filters, before deduplication
    sentences: int = 0
    tokens: int = 0
    heldout_sentences: int = 0
    heldout_tokens: int = 0
    extra_packages: dict = field(default_factory=dict)


def locate_sources(sources: list[Source]) -> dict[str, dict]:
    """Paths of every source; one MissingPackages error naming all missing packages."""
    located, missing = {}, []
    for s in sources:
        try:
            located[s.name] = s.locate()
        except MissingPackages as e:
            missing.append(e.args[0])
    if missing:
        pkgs = " ".join(dict.fromkeys(missing))
        raise MissingPackages(
            f"missing Debian package(s) {pkgs}: install with "
            f"`apt-get install -y --no-install-recommends {pkgs}` "
            f"(or leave those sources out with --sources)"
        )
    return located


def collect(
    sources: list[Source], located: dict[str, dict], limit: int | None, permille: int, log=print
) -> tuple[dict[str, list], list[SourceStats]]:
    """sentence -> [source index, held out?] over all sources, in a deterministic order."""
    table: dict[str, list] = {}
    stats = []
    for si, s in enumerate(sources):
        t0 = time.time()
        paths = located[s.name]
        st = SourceStats(
            s.name,
            s.package,
            package_version(s.package),
            s.licence,
            s.description,
            copyright_summary(s.copyright_package or s.package),
            len(paths["files"]),
            extra_packages={p: package_version(p) for p in s.extra_packages},
        )
        for doc in s.extract(paths):
            if limit is not None and st.documents >= limit:
                break
            st.documents += 1
            held = heldout_group(doc.group, permille)
            for toks in prose_sentences(doc.paragraphs):
                st.candidates += 1
                line = " ".join(toks)
                entry = table.get(line)
                if entry is None:
                    table[line] = [si, held]
                elif entry[1] and not held:
                    entry[1] = False  # seen on both sides: train only
        stats.append(st)
        log(f"  {s.name:22s} {st.documents:8d} docs {st.candidates:9d} sentences  {time.time() - t0:6.1f} s")
    return table, stats


def build(
    out: Path,
    source_names: list[str] | None = None,
    limit: int | None = None,
    seed: int = DEFAULT_SEED,
    permille: int = DEFAULT_HELDOUT_PERMILLE,
    command: str | None = None,
    log=print,
) -> dict:
    sources = [SOURCE_BY_NAME[n] for n in source_names] if source_names else list(SOURCES)
    located = locate_sources(sources)
    out.mkdir(parents=True, exist_ok=True)
    table, stats = collect(sources, located, limit, permille, log)

    train, heldout = [], []
    for line, (si, held) in table.items():
        st = stats[si]
        n = line.count(" ") + 1
        st.sentences += 1
        st.tokens += n
        if held:
            st.heldout_sentences += 1
            st.heldout_tokens += n
            heldout.append(line)
        else:
            train.append(line)
    del table
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(heldout)

    counts: collections.Counter = collections.Counter()
    for line in train:
        counts.update(line.split(" "))
    train_tokens = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def coverage(k: int) -> float:
        return round(sum(c for _, c in ranked[:k]) / max(train_tokens, 1), 5)

    files = {}
    for name, lines in (("train.txt", train), ("heldout.txt", heldout)):
        data = ("\n".join(lines) + "\n").encode("utf-8") if lines else b""
        (out / name).write_bytes(data)
        files[name] = {
            "sentences": len(lines),
            "tokens": sum(l.count(" ") + 1 for l in lines),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    result = {
        "command": command,
        "python": platform.python_version(),
        "seed": seed,
        "heldout_permille": permille,
        "limit_per_source": limit,
        "min_tokens": MIN_TOKENS,
        "max_tokens": MAX_TOKENS,
        "tokenizer_sha256": hashlib.sha256(Path(_tok.__file__).read_bytes()).hexdigest(),
        "sources": [st.__dict__ for st in stats],
        "totals": {
            "sentences": len(train) + len(heldout),
            "tokens": files["train.txt"]["tokens"] + files["heldout.txt"]["tokens"],
            "candidate_sentences": sum(st.candidates for st in stats),
        },
        "files": files,
        "vocabulary": {
            "types": len(counts),
            "size_min_count": {str(k): sum(1 for c in counts.values() if c >= k) for k in (1, 3, 5, 10)},
            "train_token_coverage_top": {str(k): coverage(k) for k in (10000, 20000, 30000, 50000)},
            "most_frequent": [[t, c] for t, c in ranked[:30]],
        },
    }
    (out / "stats.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "SOURCES.md").write_text(sources_markdown(result), encoding="utf-8")
    return result


def sources_markdown(stats: dict) -> str:
    t = stats["totals"]
    f = stats["files"]
    v = stats["vocabulary"]
    lines = [
        "# elmo-fast English corpus: sources",
        "",
        "One tokenized sentence per line (`elmo_fast.tokenizer.tokenize`), built from Debian packages "
        "by `scripts/build_corpus.py`:",
        "",
        "```",
        stats["command"] or "python scripts/build_corpus.py --out DIR",
        "```",
        "",
        f"Totals: {t['sentences']:,} sentences, {t['tokens']:,} tokens "
        f"(train {f['train.txt']['sentences']:,} sentences / {f['train.txt']['tokens']:,} tokens; "
        f"held-out {f['heldout.txt']['sentences']:,} / {f['heldout.txt']['tokens']:,}). "
        f"Held-out: groups (headwords, files, chapters, fortunes) whose sha1 falls in "
        f"{stats['heldout_permille']}/1000; seed {stats['seed']}; sentences of "
        f"{stats['min_tokens']}..{stats['max_tokens']} tokens; exact duplicates removed.",
        "",
        "| source | Debian package | version | licence | files | documents | sentences | tokens | held-out tokens |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in stats["sources"]:
        pkg = s["package"] + "".join(f" + {p} {ver}" for p, ver in s["extra_packages"].items())
        lines.append(
            f"| {s['name']} | {pkg} | {s['version']} | {s['licence']} | {s['files']:,} | "
            f"{s['documents']:,} | {s['sentences']:,} | {s['tokens']:,} | {s['heldout_tokens']:,} |"
        )
    lines += ["", "## What each source is", ""]
    for s in stats["sources"]:
        lic = ", ".join(s["copyright"]["licenses"]) or "see the file"
        lines.append(
            f"- **{s['name']}** ({s['package']}): {s['description']}. Licence: {s['licence']}. "
            f"Debian copyright file `{s['copyright']['file']}` names: {lic}."
        )
    lines += [
        "",
        "## Vocabulary (train split)",
        "",
        f"{v['types']:,} types; with count >= 1/3/5/10: "
        + " / ".join(f"{v['size_min_count'][k]:,}" for k in ("1", "3", "5", "10"))
        + ". Share of train tokens covered by the most frequent 10k/20k/30k/50k types: "
        + " / ".join(f"{v['train_token_coverage_top'][k]:.4f}" for k in ("10000", "20000", "30000", "50000"))
        + ".",
        "",
        "Most frequent: " + " ".join(f"`{w}` {c:,}" for w, c in v["most_frequent"]),
        "",
        f"sha256: train.txt {f['train.txt']['sha256']}, heldout.txt {f['heldout.txt']['sha256']}.",
        "",
        _licence_footer([s["name"] for s in stats["sources"]]),
        "",
    ]
    return "\n".join(lines)


def _licence_footer(names: list[str]) -> str:
    """The closing sentence on the corpus' terms, true of the sources it was built from."""
    copyleft = [n for n in names if n not in PERMISSIVE_SOURCES]
    if not copyleft:
        return (
            "These files are data derived from the packages above and carry their licences, each permissive "
            "or public domain (for the dual-licensed ones, the permissive choice: perl-doc under the Artistic "
            "licence, maint-guide under MIT); they are not part of elmo-fast's source."
        )
    return (
        "These files are data derived from the packages above and carry their licences; "
        f"{', '.join(copyleft)} are GPL or GFDL (or quotations of varied origin), the rest permissive or "
        "public domain; they are not part of elmo-fast's source."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--sources", help="comma-separated subset of: " + ",".join(SOURCE_BY_NAME))
    ap.add_argument(
        "--permissive",
        action="store_true",
        help="only the sources under permissive or public-domain terms: " + ",".join(PERMISSIVE_SOURCES),
    )
    ap.add_argument(
        "--limit-per-source", type=int, default=None, metavar="N", help="read only the first N documents of each source"
    )
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--heldout-permille", type=int, default=DEFAULT_HELDOUT_PERMILLE)
    ap.add_argument("--list-sources", action="store_true", help="print the sources and their packages")
    args = ap.parse_args(argv)
    if args.list_sources:
        for s in SOURCES:
            print(f"{s.name:22s} {' '.join((s.package,) + s.extra_packages):32s} {s.licence}")
        return 0
    names = list(PERMISSIVE_SOURCES) if args.permissive else None
    if args.sources and args.permissive:
        print("error: --sources and --permissive are exclusive; give one", file=sys.stderr)
        return 2
    if args.sources:
        names = [n.strip() for n in args.sources.split(",") if n.strip()]
        unknown = [n for n in names if n not in SOURCE_BY_NAME]
        if unknown:
            print(f"error: unknown source(s) {', '.join(unknown)}; known: {', '.join(SOURCE_BY_NAME)}", file=sys.stderr)
            return 2
    command = "python scripts/build_corpus.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    t0 = time.time()
    try:
        res = build(
            args.out,
            names,
            args.limit_per_source,
            args.seed,
            args.heldout_permille,
            command,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except MissingPackages as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    f = res["files"]
    print(
        f"wrote {args.out}: train {f['train.txt']['sentences']:,} sentences / {f['train.txt']['tokens']:,} "
        f"tokens, held-out {f['heldout.txt']['sentences']:,} / {f['heldout.txt']['tokens']:,} "
        f"({time.time() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
