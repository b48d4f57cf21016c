"""Word tokenizer and sentence splitter for English text, in the style of ELMo's training data.

ELMo's models were trained on the 1B Word Benchmark, whose text is tokenized roughly as the Penn
Treebank does it: punctuation is split off words, clitics are split (``do n't``, ``John 's``),
hyphenated words, numbers and abbreviations stay whole. A model gives its best vectors for text
tokenized the way its training data was, so elmo-fast's bundled model is trained on text that went
through :func:`tokenize`, and ``--tokenize`` on the CLI runs the same function on raw input.

This module is pure standard library and deterministic. It only *segments*: no character is
changed, added or dropped except whitespace, so ``"".join(tokenize(t)) == "".join(t.split())``
for every string ``t``, no token is empty and no token contains whitespace.

>>> tokenize("Hello, world!")
['Hello', ',', 'world', '!']
>>> tokenize("I don't think John's car costs $1,000.50 (e.g. in the U.S.)...")
['I', 'do', "n't", 'think', 'John', "'s", 'car', 'costs', '$', '1,000.50', '(', 'e.g.', 'in', 'the', 'U.S.', ')', '...']
>>> tokenize('She said "state-of-the-art" -- see https://example.org/a?b=1.')
['She', 'said', '"', 'state-of-the-art', '"', '--', 'see', 'https://example.org/a?b=1', '.']
>>> split_sentences("Dr. Smith arrived at 5 p.m. on Monday. He was late! Was he? Yes.")
['Dr. Smith arrived at 5 p.m. on Monday.', 'He was late!', 'Was he?', 'Yes.']
>>> tokenize_line("We can't go.\\n")
['We', 'ca', "n't", 'go', '.']

Speed (one core, pure Python): about 1.3 million tokens/s on running English prose (the King
James Bible, 4.3 MB, 0.95M tokens, cold cache; 2M tokens/s once the chunk cache is warm), about
0.45 million tokens/s on markup-heavy text (raw GCIDE dictionary source); ``split_sentences``
reads about 4.5 MB/s. Time is linear in the input whatever its shape: a 1 MB line without spaces
(a run of ``+a+a...``, of punctuation, of one-letter words, a URL followed by dots) takes at most
about 0.4 s of CPU; ``tests/support/tokenizer_spec.py`` holds the rules as the single plain pattern that
this module's faster, linear form is tested against.

Rules of :func:`tokenize`, in order of priority at each position:

- URLs (``http://``, ``https://``, ``ftp://``, ``www.``) and e-mail addresses are one token;
  closing punctuation at their end (``.``, ``,``, ``)``, quotes...) is split off.
- ``...`` (two or more dots) and ``--`` (two or more hyphens) are one token each; PTB quotes
  ````` and ``''`` are one token each.
- Abbreviations keep their period: known ones (``Dr.``, ``Mr.``, ``etc.``, ``vs.``, ``Jan.``...),
  letter-dot sequences (``e.g.``, ``i.e.``, ``U.S.``, ``a.m.``) and single capital initials
  (``J.``). A sentence-final abbreviation keeps its period too (``in the U.S.`` ends with
  ``U.S.``): the tokenizer never invents a second period.
- Words are runs of letters, digits, combining marks and ``_``, joined by ``-``, ``.``, ``&``,
  ``/``, ``@``, ``:`` or an apostrophe when a word character follows, and by ``,`` between
  digits: ``state-of-the-art``, ``3.14``, ``1,000``, ``10:30``, ``and/or``, ``AT&T``,
  ``rock'n'roll``; a path may start with ``/`` (``/usr/share/doc``). Any script that
  ``str.isalnum`` knows counts as letters, so Cyrillic, Greek, Arabic, Devanagari, CJK text is
  split on whitespace and punctuation only.
- Clitics are split as the Penn Treebank does: ``n't`` (``don't`` -> ``do n't``,
  ``can't`` -> ``ca n't``) and ``'s 're 'll 've 'm 'd`` (``John's`` -> ``John 's``,
  ``I'm`` -> ``I 'm``), with ``'`` or ``’``; an already split clitic (``'s``, ``n't``) stays one
  token, so tokenizing tokenized text gives it back.
- Every other non-space character (punctuation, quotes, brackets, symbols such as ``$ % #``) is a
  token of its own.
"""

from __future__ import annotations

import re
import sys
import unicodedata

__all__ = ["tokenize", "tokenize_line", "split_sentences", "ABBREVIATIONS"]

#: Abbreviations whose period stays part of the token (and after which, apart from a few that
#: often end sentences, :func:`split_sentences` does not split). Case-sensitive as written.
ABBREVIATIONS = frozenset(
    """
    Mr Mrs Ms Messrs Dr Prof Ph.D St Sr Jr Mt Gen Col Lt Sgt Capt Cmdr Adm Maj Rev Gov Sen Rep Hon Pres
    Supt Bros Ave Blvd Rd Dept Univ Inc Ltd Co Corp Assn Esq
    vs etc cf viz approx ca al ibid esp fig Fig figs Figs eq Eq Eqs sec Sec ch Ch chap vol Vol vols
    No Nos pp ed eds trans
    Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec
    Mon Tue Tues Wed Thu Thur Thurs Fri
    """.split()
)

#: Abbreviations that end sentences often enough that a following capital starts a new one.
_SENTENCE_FINAL_ABBREVIATIONS = frozenset("etc Inc Ltd Co Corp Bros esp al".split())


def _mark_classes() -> tuple[str, str]:
    """Regex character-class bodies of the combining marks (Mn, Mc, Me) and ZWNJ/ZWJ: those of the
    Basic Multilingual Plane, and those above it (plane 1 and the variation selectors of plane 14).

    ``\\w`` in Python's ``re`` is ``str.isalnum() or '_'``, which leaves out combining marks: the
    vowel signs of Indic scripts, Hebrew points, Latin combining accents. Words in those scripts
    would fall apart without them. Two classes, because ``re`` tests a class of BMP characters in
    one table look-up but one holding astral characters range by range (~300 ranges: 0.2 us for
    every character it rejects). Built once at import (a few tens of milliseconds).
    """
    ranges: list[tuple[int, int]] = []
    for cp in list(range(0x20000)) + list(range(0xE0100, 0xE01F0)):
        if unicodedata.category(chr(cp)) in ("Mn", "Mc", "Me") or cp in (0x200C, 0x200D):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))

    def body(rs: list[tuple[int, int]]) -> str:
        return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in rs)

    return body([r for r in ranges if r[1] < 0x10000]), body([r for r in ranges if r[0] >= 0x10000])


_BMP_MARKS, _ASTRAL_MARKS = _mark_classes()
# a word character; the astral marks' class is tried only for astral characters (one range test)
_W = rf"(?:[\w{_BMP_MARKS}]|(?=[\U00010000-\U0010FFFF])[{_ASTRAL_MARKS}])"
_APOS = "'\u2019"  # ASCII apostrophe and RIGHT SINGLE QUOTATION MARK
_ABBREV_ALT = "|".join(sorted((re.escape(a) for a in ABBREVIATIONS), key=len, reverse=True))
_CLOSERS = r"""[.,;:!?)\]}'"\u2019\u201d\u00bb>]"""

# Every rule is linear in the chunk: no match attempt rescans what an attempt at an earlier position
# scanned (a 1 MB chunk of any shape takes well under a second). E-mail addresses, whose local part
# would be rescanned from every position of a run such as "+a+a+a...", are found by one pass over
# the chunk's runs (_email_ends) and taken between this pattern's matches (_tokens_with_emails).
_TOKEN_RE = re.compile(
    rf"""
    [!"#$%&()*+,:;<=>?@\[\\\]^{{|}}~]                             # ASCII punctuation no longer token starts with
  | (?!{_W})[^.\-`/{_APOS}]                                    # any other such character
  | \.{{2,}} | -{{2,}} | `` | ''                                # ellipsis, dash, PTB quotes
  | [.-]                                                        # a lone period or hyphen
  | (?:(?:https?|ftp)://|www\.)(?:\S*[^\s{_CLOSERS[1:-1]}]|\S)  # URL to the chunk's end, closing punctuation left
  | (?<!{_W})(?=[A-Za-z]+\.)(?:{_ABBREV_ALT})\.(?!{_W})         # known abbreviation: Dr.
  | (?<!{_W})(?:[^\W\d_]\.){{2,}}(?!{_W})                       # letter-dot run: e.g. U.S.
  | (?<!{_W})[A-Z]\.(?!{_W})                                    # initial: J.
  | [{_APOS}](?:[sSmMdD]|re|RE|ll|LL|ve|VE)(?!{_W})             # split clitic: 's 're 'll
  | /?{_W}+(?:(?:[-.&/@:]|[{_APOS}]|(?<=\d),(?=\d)){_W}+)*      # word, number, /path
  | \S                                                          # any other character
    """,
    re.VERBOSE,
)

# An e-mail address: a local part of [\w.+-] (from any position of such a run), "@", a dotted domain.
_LOCAL_RUN_RE = re.compile(r"[\w.+-]+")
_URL_START_RE = re.compile(r"(?:(?:https?|ftp)://|www\.)\S")  # the URL rule matches here
_DOMAIN_RE = re.compile(rf"{_W}+(?:[.-]{_W}+)*\.{_W}+")

_CLITIC_RE = re.compile(rf"(?i)^(.+?)(n[{_APOS}]t|[{_APOS}](?:s|re|ll|ve|m|d))$")


def _split_clitic(word: str) -> list[str]:
    m = _CLITIC_RE.match(word)
    if m is None:
        return [word]
    stem, clitic = m.group(1), m.group(2)
    if clitic[0] in "nN" and not stem[-1].isalpha():
        return [word]
    return [stem, clitic]


def tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens (see the module docstring for the rules).

    Each whitespace-separated chunk is tokenized on its own (no rule looks across whitespace),
    and the tokens of the most frequent chunks are remembered (a bounded cache): natural text
    repeats its chunks, so most of them cost one dictionary look-up.

    >>> tokenize("It's 3.14, isn't it?")
    ['It', "'s", '3.14', ',', 'is', "n't", 'it', '?']
    >>> tokenize("Mail me at jane.doe@example.com.")
    ['Mail', 'me', 'at', 'jane.doe@example.com', '.']
    >>> tokenize("Москва — столица России.")
    ['Москва', '—', 'столица', 'России', '.']
    >>> tokenize("   ")
    []
    """
    out: list[str] = []
    extend = out.extend
    cache = _CHUNK_CACHE
    for chunk in text.split():
        toks = cache.get(chunk)
        if toks is None:
            toks = _tokenize_chunk(chunk)
            if len(cache) < _CHUNK_CACHE_SIZE and len(chunk) <= _CHUNK_CACHE_MAX_LEN:
                cache[chunk] = toks
        extend(toks)
    return out


#: chunk -> its tokens; filled until it holds _CHUNK_CACHE_SIZE chunks, then only read.
_CHUNK_CACHE: dict[str, tuple[str, ...]] = {}
_CHUNK_CACHE_SIZE = 1 << 18
#: longer chunks are not remembered (natural text rarely repeats them; a hostile line would fill memory)
_CHUNK_CACHE_MAX_LEN = 64


def _tokenize_chunk(chunk: str) -> tuple[str, ...]:
    """Tokens of one whitespace-free chunk."""
    if chunk.isalpha():  # the common case: one plain word
        return (chunk,)
    out: list[str] = []
    for tok in _rule_matches(chunk):
        if ("'" in tok or "\u2019" in tok) and len(tok) > 2 and "/" not in tok and "@" not in tok:
            out.extend(_split_clitic(tok))
        else:
            out.append(tok)
    return tuple(out)


def _rule_matches(chunk: str) -> list[str]:
    """The rules' matches in a whitespace-free chunk, in order (clitics not yet split)."""
    at = chunk.find("@", 1)
    if at > 0 and chunk.find(".", at) > 0:  # an address needs a local part and a dotted domain
        return _tokens_with_emails(chunk)
    return _TOKEN_RE.findall(chunk)


def _email_ends(chunk: str) -> list[tuple[int, int, int]]:
    """``(start, at, end)`` of each run of local-part characters that ends at an "@" followed by a
    domain: an address starts at any position of ``chunk[start:at]`` and ends at ``end``."""
    found = []
    for run in _LOCAL_RUN_RE.finditer(chunk):
        at = run.end()
        if at < len(chunk) and chunk[at] == "@":
            domain = _DOMAIN_RE.match(chunk, at + 1)
            if domain:
                found.append((run.start(), at, domain.end()))
    return found


def _tokens_with_emails(chunk: str) -> list[str]:
    """The tokens of a chunk holding an "@": at each position a URL first, then an e-mail address,
    then the other rules, as one pattern with the e-mail rule second would give them."""
    emails = _email_ends(chunk)
    if not emails:
        return _TOKEN_RE.findall(chunk)
    out: list[str] = []
    pos, k, n = 0, 0, len(chunk)
    match = _TOKEN_RE.match
    while pos < n:
        while k < len(emails) and emails[k][1] <= pos:
            k += 1
        if k < len(emails) and emails[k][0] <= pos and not _URL_START_RE.match(chunk, pos):
            end = emails[k][2]
        else:
            end = match(chunk, pos).end()
        out.append(chunk[pos:end])
        pos = end
    return out


def tokenize_line(line: str) -> list[str]:
    """Tokens of one line of untokenized text (one sentence per line, as ``--tokenize`` reads it).

    The same as :func:`tokenize`; the line's own newline, if any, is whitespace like any other.

    >>> tokenize_line("The cat's on the mat.\\n")
    ['The', 'cat', "'s", 'on', 'the', 'mat', '.']
    """
    return tokenize(line)


_tokenize = tokenize  # (split_text's parameter takes the name)


def split_text(text: str, tokenize: bool) -> list[str]:
    """Raw text into tokens, the one rule of every front that takes text: ``tokenize`` True, the tokens of
    :func:`tokenize` (punctuation and clitics apart, as the bundled model's training text); False, the
    text split at whitespace (text tokenized already, allennlp's format).

    Each front says which it does (the same text gives the same tokens everywhere for the same choice):

    ======================================== ================================ ==========================
    front                                    default                          otherwise
    ======================================== ================================ ==========================
    ``elmo-fast embed`` / ``embed_file``     whitespace: a file of tokenized  ``--tokenize`` /
    (one sentence a line)                    lines, as ``allennlp elmo`` read ``tokenize=True``
    Ray's ``ElmoBatchEmbedder``              whitespace: the same files,      ``tokenize=True``
    (``text_column``)                        read by ``ray.data.read_text``
    ``elmo-fast serve``: ``texts``,          tokenized: these fields are raw  send ``sentences``
    ``/v1/embeddings``' ``input``            text by name (OpenAI's clients)  (lists of tokens)
    ======================================== ================================ ==========================

    The defaults differ on purpose and stay: files of one tokenized sentence a line are allennlp's
    format, which ``embed`` and its users' pipelines rely on, while a field named for raw text is
    tokenized. The Python API takes tokens (``embed_sentence``, ``embed_batch``); a string given there is
    an error suggesting this function.

    >>> split_text("The cat's on the mat.", tokenize=True)
    ['The', 'cat', "'s", 'on', 'the', 'mat', '.']
    >>> split_text("The cat 's on the mat .", tokenize=False)
    ['The', 'cat', "'s", 'on', 'the', 'mat', '.']
    """
    return _tokenize(text) if tokenize else text.split()


# ---- sentences ---------------------------------------------------------------------------------

_OPENERS = "\"'\u201c\u2018([{\u00ab"
_BOUNDARY_RE = re.compile(
    r"""(?:\.{2,}|[.!?\u2026]+)             # terminal punctuation
        [\"'\u201d\u2019)\]}\u00bb]*          # closing quotes and brackets
        (?=\s)""",
    re.VERBOSE,
)
_PARAGRAPH_RE = re.compile(r"\n[ \t\r\f\v]*\n\s*")


def _is_boundary(text: str, start: int, end: int) -> bool:
    """Whether the terminal punctuation text[start:end] (with closers) ends a sentence."""
    # what follows: whitespace, then optional opening quotes/brackets, then an upper-case letter
    j = end
    n = len(text)
    while j < n and text[j].isspace():
        j += 1
    while j < n and text[j] in _OPENERS:
        j += 1
    if j >= n or not text[j].isupper():
        return False
    if text[start] != "." or text[start : start + 2] == "..":
        return True
    # a single period: not after an abbreviation or an initial
    k = start
    while k > 0 and not text[k - 1].isspace():
        k -= 1
    word = text[k:start].lstrip(_OPENERS)
    if not word:
        return True
    if word in ABBREVIATIONS and word not in _SENTENCE_FINAL_ABBREVIATIONS:
        return False
    if len(word) == 1 and word.isupper():
        return False  # an initial: J. Smith
    if word.lower() in ("e.g", "i.e", "viz", "cf"):
        return False
    return True


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences, each with its whitespace normalised to single spaces.

    A sentence ends at ``.``, ``!``, ``?``, ``…`` or ``...`` (with any closing quotes or brackets
    after it) when whitespace and then an upper-case letter, possibly after opening quotes or
    brackets, follow; not after a known abbreviation (``Dr.``, ``e.g.``, ``No.``; see
    :data:`ABBREVIATIONS`) or a single capital initial (``J. Smith``). A blank line always ends a
    sentence (paragraphs never run together). Good enough for dictionary glosses and prose
    documentation; it does not try to be a statistical splitter.

    >>> split_sentences('He said "Stop." Then he left.\\n\\nNew paragraph without a period')
    ['He said "Stop."', 'Then he left.', 'New paragraph without a period']
    >>> split_sentences("J. R. R. Tolkien wrote it, i.e. the book. It sold well.")
    ['J. R. R. Tolkien wrote it, i.e. the book.', 'It sold well.']
    """
    sentences: list[str] = []
    for para in _PARAGRAPH_RE.split(text):
        start = 0
        for m in _BOUNDARY_RE.finditer(para):
            if _is_boundary(para, m.start(), m.end()):
                s = " ".join(para[start : m.end()].split())
                if s:
                    sentences.append(s)
                start = m.end()
        s = " ".join(para[start:].split())
        if s:
            sentences.append(s)
    return sentences


def _main(argv: list[str] | None = None) -> int:
    """``python -m elmo_fast.tokenizer [--sentences] < in > out``: one tokenized line per line
    (or per sentence with ``--sentences``)."""
    import io

    args = sys.argv[1:] if argv is None else argv
    # lines end at "\n" or "\r\n" only, as everywhere the package reads text (a lone "\r" is no line end)
    stdin = (
        sys.stdin
        if not hasattr(sys.stdin, "buffer")
        else io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape", newline="\n")
    )
    if args and args[0] == "--sentences":
        for s in split_sentences(stdin.read().replace("\r\n", "\n")):
            print(" ".join(tokenize(s)))
        return 0
    for line in stdin:
        print(" ".join(tokenize_line(line)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
