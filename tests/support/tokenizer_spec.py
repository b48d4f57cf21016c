"""The tokenizer's rules as one plain pattern: the specification elmo_fast.tokenizer implements.

This is the tokenizer as it was first written (and as the bundled model's corpus was tokenized):
one regular expression, every rule an alternative in priority order, tried at every position. It
is obviously right and can take quadratic time on hostile chunks (an e-mail rule rescanning a run
of "+a+a+a..." from each position; a URL's lookahead rescanning trailing punctuation), which is why
the package's version is restructured (linear, and faster) and tested against this one.
"""

from __future__ import annotations

import re

from elmo_fast.tokenizer import _APOS, _ASTRAL_MARKS, _BMP_MARKS, ABBREVIATIONS

_W = rf"[\w{_BMP_MARKS}{_ASTRAL_MARKS}]"
_ABBREV_ALT = "|".join(sorted((re.escape(a) for a in ABBREVIATIONS), key=len, reverse=True))
_CLOSERS = r"""[.,;:!?)\]}'"\u2019\u201d\u00bb>]"""

SPEC_RE = re.compile(
    rf"""
    (?:(?:https?|ftp)://|www\.)\S+?(?={_CLOSERS}*(?:\s|$))      # URL, closing punctuation left
  | [\w.+-]+@{_W}+(?:[.-]{_W}+)*\.{_W}+                         # e-mail address
  | \.{{2,}} | -{{2,}} | `` | ''                                # ellipsis, dash, PTB quotes
  | (?<!{_W})(?:{_ABBREV_ALT})\.(?!{_W})                        # known abbreviation: Dr.
  | (?<!{_W})(?:[^\W\d_]\.){{2,}}(?!{_W})                       # letter-dot run: e.g. U.S.
  | (?<!{_W})[A-Z]\.(?!{_W})                                    # initial: J.
  | [{_APOS}](?:[sSmMdD]|re|RE|ll|LL|ve|VE)(?!{_W})             # split clitic: 's 're 'll
  | /?{_W}+(?:(?:[-.&/@:]|[{_APOS}]|(?<=\d),(?=\d)){_W}+)*      # word, number, /path
  | \S                                                          # any other character
    """,
    re.VERBOSE,
)


def spec_chunk_matches(chunk: str) -> list[str]:
    """The rule matches of one whitespace-free chunk, before clitics are split."""
    return SPEC_RE.findall(chunk)
