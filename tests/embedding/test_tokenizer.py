"""elmo_fast.tokenizer: PTB / 1B-Word-Benchmark style tokens and a rule-based sentence splitter."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elmo_fast import tokenizer
from elmo_fast.tokenizer import split_sentences, tokenize, tokenize_line

CASES = [
    # punctuation
    ("Hello, world!", "Hello , world !"),
    ("Yes; no: maybe?", "Yes ; no : maybe ?"),
    ("Wait... what?! Really…", "Wait ... what ? ! Really …"),
    ("x--y -- z", "x -- y -- z"),
    ("—em dash—", "— em dash —"),
    # clitics, as the Penn Treebank splits them
    ("don't", "do n't"),
    ("can't won't isn't", "ca n't wo n't is n't"),
    ("DON'T", "DO N'T"),
    ("John's", "John 's"),
    ("I'm you're we'll they've he'd", "I 'm you 're we 'll they 've he 'd"),
    ("students' books", "students ' books"),
    ("O'Neil's rock'n'roll", "O'Neil 's rock'n'roll"),
    ("John\u2019s don\u2019t", "John \u2019s do n\u2019t"),
    # quotes and brackets
    ('"Quoted," she said.', '" Quoted , " she said .'),
    ("He said 'hello'.", "He said ' hello ' ."),
    ("\u2018curly\u2019 \u201cdouble\u201d", "\u2018 curly \u2019 \u201c double \u201d"),
    ("(round) [square] {curly}", "( round ) [ square ] { curly }"),
    ("``PTB quotes''", "`` PTB quotes ''"),
    # hyphens, slashes, ampersands
    ("state-of-the-art, well-known e-mail", "state-of-the-art , well-known e-mail"),
    ("and/or AT&T", "and/or AT&T"),
    ("in /etc/apt/sources.list.", "in /etc/apt/sources.list ."),
    ("a / b, 1/2", "a / b , 1/2"),
    # numbers
    ("3.14 and 1,000 and 1,000.50", "3.14 and 1,000 and 1,000.50"),
    ("$5.99 or 5%", "$ 5.99 or 5 %"),
    ("at 10:30 in the 1990s, 2nd and 3rd", "at 10:30 in the 1990s , 2nd and 3rd"),
    ("-5 and +3", "- 5 and + 3"),
    ("1, 2, 3.", "1 , 2 , 3 ."),
    # abbreviations and initials
    ("e.g. i.e. etc.", "e.g. i.e. etc."),
    ("Dr. Who met Mr. T. at St. Paul's.", "Dr. Who met Mr. T. at St. Paul 's ."),
    ("The U.S. Army and the U.K.", "The U.S. Army and the U.K."),
    ("5 p.m. today", "5 p.m. today"),
    ("Ph.D. students", "Ph.D. students"),
    ("J. R. R. Tolkien", "J. R. R. Tolkien"),
    ("the end.", "the end ."),
    ("Drive.", "Drive ."),
    # URLs and e-mail addresses
    ("see https://example.org/a?b=1&c=2.", "see https://example.org/a?b=1&c=2 ."),
    ("(www.example.com/path)", "( www.example.com/path )"),
    ("ftp://ftp.debian.org/debian/, then", "ftp://ftp.debian.org/debian/ , then"),
    ("mail jane.doe+x@mail.example.co.uk!", "mail jane.doe+x@mail.example.co.uk !"),
    # code-like text stays segmented, never merged across whitespace
    ("os.path.join() works", "os.path.join ( ) works"),
    ("x=1;y=2", "x = 1 ; y = 2"),
    ("C++ and C#", "C + + and C #"),
    ("file.txt.", "file.txt ."),
    # non-Latin scripts: split on whitespace and punctuation
    ("Привет, мир!", "Привет , мир !"),
    ("Москва — столица России.", "Москва — столица России ."),
    ("Καλημέρα κόσμε;", "Καλημέρα κόσμε ;"),
    ("日本語のテキスト。次の文！", "日本語のテキスト 。 次の文 ！"),
    ("हिन्दी भाषा।", "हिन्दी भाषा ।"),
    ("مرحبا بالعالم", "مرحبا بالعالم"),
    ("naïve café coöperate", "naïve café coöperate"),
    ("a\u0301b c\u0327", "a\u0301b c\u0327"),  # combining marks stay in their word
    ("emoji 😀 ok", "emoji 😀 ok"),
    # whitespace
    ("  many \t spaces\n\nand lines  ", "many spaces and lines"),
    ("non\u00a0breaking", "non breaking"),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_tokenize_cases(text, expected):
    assert tokenize(text) == expected.split(" ")


@pytest.mark.parametrize("text", ["", " ", "\n", "\t \u00a0\u2003 \r\n"])
def test_empty_and_whitespace_input(text):
    assert tokenize(text) == []
    assert tokenize_line(text) == []
    assert split_sentences(text) == []


@pytest.mark.parametrize("text,expected", CASES)
def test_idempotent_on_tokenized_text(text, expected):
    """Tokenizing already tokenized text gives the same tokens (split clitics stay whole)."""
    assert tokenize(expected) == expected.split(" ")


def test_idempotent_on_1b_benchmark_style_lines():
    lines = [
        "The U.S. Centers for Disease Control and Prevention said it is n't clear .",
        "`` We 're not going to do that , '' he said , adding that it 's 3.5 % lower .",
        "Dr. Smith 's book , published in 1999 , costs $ 20 .",
    ]
    for line in lines:
        assert tokenize(line) == line.split(" ")


def test_tokenize_line_ignores_newline():
    assert tokenize_line("We can't go.\n") == ["We", "ca", "n't", "go", "."]
    assert tokenize_line("We can't go.\r\n") == tokenize("We can't go.")


def test_deterministic_and_cache_transparent():
    text = "The cat's on the mat, isn't it? " * 3
    first = tokenize(text)
    tokenizer._CHUNK_CACHE.clear()
    assert tokenize(text) == first
    assert tokenizer._tokenize_chunk("isn't") == ("is", "n't")


def test_doctests():
    failures, tests = doctest.testmod(tokenizer)
    assert tests > 5 and failures == 0


# ---- sentences ---------------------------------------------------------------------------------

SENTENCE_CASES = [
    ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
    ("Dr. Smith arrived at 5 p.m. on Monday. He was late.", ["Dr. Smith arrived at 5 p.m. on Monday.", "He was late."]),
    ("J. R. R. Tolkien wrote it. It sold.", ["J. R. R. Tolkien wrote it.", "It sold."]),
    ("Use a tool, e.g. Python. Or not.", ["Use a tool, e.g. Python.", "Or not."]),
    ("See No. 5 and Fig. 3 there.", ["See No. 5 and Fig. 3 there."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("He said: (It works.) Fine.", ["He said: (It works.)", "Fine."]),
    ('Ends here. "Quoted start."', ["Ends here.", '"Quoted start."']),
    ("lower case after period. stays together", ["lower case after period. stays together"]),
    ("Version 3.11 is out. It is fast.", ["Version 3.11 is out.", "It is fast."]),
    ("Wait... Then what?", ["Wait...", "Then what?"]),
    ("Fruit, vegetables, etc. They sell all.", ["Fruit, vegetables, etc.", "They sell all."]),
    ("a line\nwrapped in\n  the middle. Next", ["a line wrapped in the middle.", "Next"]),
    ("Para one\n\nPara two.", ["Para one", "Para two."]),
    ("Bis 1.\n  \nBis 2.", ["Bis 1.", "Bis 2."]),
    ("Привет. Как дела?", ["Привет.", "Как дела?"]),
    ('To bathe; to take a bath. "They bathe in summer."', ["To bathe; to take a bath.", '"They bathe in summer."']),
]


@pytest.mark.parametrize("text,expected", SENTENCE_CASES)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


# ---- properties --------------------------------------------------------------------------------

_alphabet = st.one_of(
    st.sampled_from(list("abcXYZ019 .,;:!?'\"()[]{}-/@&$%#`\u2019\u201c\u201d\u2026\n\t_+=*")),
    st.characters(),
)
_texts = st.text(_alphabet, max_size=80)


@given(_texts)
@settings(max_examples=400, deadline=None)
def test_property_tokens_partition_the_text(text):
    toks = tokenize(text)
    assert all(toks), "no empty token"
    assert not any(any(c.isspace() for c in t) for t in toks), "no whitespace inside a token"
    assert "".join(toks) == "".join(text.split())


@given(_texts)
@settings(max_examples=200, deadline=None)
def test_property_sentences_cover_the_text(text):
    sents = split_sentences(text)
    assert all(s and s == " ".join(s.split()) for s in sents)
    assert "".join("".join(sents).split()) == "".join(text.split())


_words = st.lists(
    st.sampled_from(
        [
            "the",
            "cat",
            "John",
            "'s",
            "do",
            "n't",
            ",",
            ".",
            "U.S.",
            "3.14",
            "1,000",
            "e.g.",
            '"',
            "(",
            ")",
            "state-of-the-art",
            "Москва",
            "...",
            "--",
            "``",
            "''",
            "?",
            "!",
            "Dr.",
            "it",
            "'re",
            "$",
            "%",
        ]
    ),
    min_size=1,
    max_size=30,
)


@given(_words)
@settings(max_examples=200, deadline=None)
def test_property_idempotent_on_token_sequences(words):
    """Tokens joined by spaces tokenize back to themselves."""
    once = tokenize(" ".join(words))
    assert tokenize(" ".join(once)) == once


# ---- the rules as one plain pattern (tests/support/tokenizer_spec.py), and linear time ----------

_SPEC_PIECES = list("aAbZ1.9,+-@/&:'\u2019`()\".!?h@+.-_$") + [
    "http://",
    "www.",
    "ftp://",
    "n't",
    "'s",
    "Dr",
    "e.g",
    "U.S",
    "Ph.D",
    "\u00df",
    "\u00e9",
    "\u0301",
    "\U0001d167",
    "x@y.com",
    ".)",
    "..",
    "--",
    "``",
    "''",
    "\u0915\u093f",
    "\u2026",
    "\u201d",
]


def test_rules_equal_the_one_pattern_specification_on_random_chunks():
    import random

    from tokenizer_spec import spec_chunk_matches

    rng = random.Random()
    seed = rng.randrange(2**32)
    rng.seed(seed)
    for _ in range(20_000):
        chunk = "".join(rng.choice(_SPEC_PIECES) for _ in range(rng.randint(1, 24)))
        assert tokenizer._rule_matches(chunk) == spec_chunk_matches(chunk), (seed, chunk)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_SPEC_PIECES), min_size=1, max_size=24).map("".join))
def test_property_rules_equal_the_specification(chunk):
    from tokenizer_spec import spec_chunk_matches

    assert tokenizer._rule_matches(chunk) == spec_chunk_matches(chunk)


# Shapes on which a rule used to rescan what it had scanned (quadratic: "+a" * 4,000 took 1.6 s),
# and shapes of one long token or of a million one-character tokens.
_HOSTILE = {
    "plus-letters": "+a",
    "plus-letters-at-end": None,
    "url-then-dots": None,
    "dots-letters": ".a",
    "addresses": "a@b.",
    "at-letters": "a@",
    "plus-at": "+@",
    "mixed": "a.+b-c@",
    "closers": ".)",
    "punctuation": "!?;(",
    "apostrophes": "'a",
    "clitics": "a's",
    "initials": "A.",
    "abbreviations": "Dr.",
    "digits-commas": "1,",
    "slashes": "/a",
    "urls": "(http://a",
    "one-word": "a",
    "marks": "a\u0301",
    "astral-marks": "\U0001d167a",
}


def _hostile(name: str, n: int) -> str:
    if name == "plus-letters-at-end":
        return "+a" * (n // 2) + "@b.c"
    if name == "url-then-dots":
        return "http://x" + "." * n
    unit = _HOSTILE[name]
    return (unit * (n // len(unit) + 1))[:n]


@pytest.mark.parametrize("name", sorted(_HOSTILE))
def test_a_long_line_of_any_shape_takes_time_linear_in_its_length(name):
    """A hostile line costs in proportion to its length: 512 kB takes at most 128x the CPU of 32 kB (16x the
    bytes; a quadratic scan would take 256x). The room over 16x is the caches': a 32 kB line stays in them
    and a 512 kB one need not (measured on an AVX2 AMD EPYC with 512 kB of L2 per core: up to 84x, while
    1 MB took 1.8x-2.2x the CPU of 512 kB on every shape). A ratio measured in one run, not a time: a busy or slow
    machine moves both alike. The garbage collector is paused while timing: its passes over every live
    token are not the tokenizer's."""
    import gc
    import time

    def cpu_seconds(n: int) -> float:
        line = _hostile(name, n)
        best = float("inf")
        for _ in range(3 if n < (1 << 19) else 1):
            tokenizer._CHUNK_CACHE.clear()
            gc.disable()
            try:
                start = time.process_time()  # CPU time: other processes on the machine do not count
                tokens = tokenize(line)
                best = min(best, time.process_time() - start)
            finally:
                gc.enable()
        assert "".join(tokens) == line
        return best

    small = max(cpu_seconds(1 << 15), 1e-3)  # a floor: the process clock's resolution on a fast line
    large = cpu_seconds(1 << 19)
    assert large < 128 * small, f"{name}: {large:.3f} s of CPU for 512 kB, {small:.4f} s for 32 kB"
    assert len(tokenizer._CHUNK_CACHE) <= 1 or all(len(c) <= 64 for c in tokenizer._CHUNK_CACHE)
