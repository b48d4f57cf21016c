"""``elmo-fast vocab``: a biLM vocabulary from corpora, in bilm-tf's format."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from ..errors import InputError, Param
from ..formats.vocab import BOS, EOS, SPECIAL_TOKENS, UNK, Vocabulary
from ..textio import DEFAULT_MAX_LINE_LENGTH, iter_text_lines


def count_tokens(
    files: Sequence[str],
    tokenize: Callable[[str], list[str]] | None = None,
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
) -> tuple[Counter, int]:
    """Token counts over every line of every file, and the number of non-empty lines (sentences)."""
    counts: Counter = Counter()
    sentences = 0
    for path in files:
        for line in iter_text_lines(path, max_line_length=max_line_length):
            tokens = tokenize(line) if tokenize else line.split()
            if tokens:
                counts.update(tokens)
                sentences += 1
    return counts, sentences


def build_vocabulary(
    files: Sequence[str],
    min_count: int = 1,
    max_size: int | None = None,
    tokenize: Callable[[str], list[str]] | None = None,
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
) -> tuple[Vocabulary, dict]:
    """The vocabulary of the corpora: ``</S>``, ``<S>``, ``<UNK>`` first (as bilm-tf's files have
    them: every sentence has one of each boundary, so they are among the most frequent "words"), then
    every token seen at least ``min_count`` times, most frequent first (ties in first-seen order),
    cut to ``max_size`` entries in all. Returns it and statistics (sentences, tokens, coverage)."""
    if min_count < 1:
        raise InputError(Param("min_count"), f" must be >= 1, got {min_count}")
    if max_size is not None and max_size < len(SPECIAL_TOKENS) + 1:
        raise InputError(
            Param("max_size"),
            f" must be at least {len(SPECIAL_TOKENS) + 1} (the 3 special tokens and one word), got {max_size}",
        )
    counts, sentences = count_tokens(files, tokenize, max_line_length)
    if sentences == 0:
        raise InputError(f"{', '.join(files)}: no sentences (every line is empty)")
    for special in (BOS, EOS, UNK):
        counts.pop(special, None)  # a literal <S> in the text is the boundary token anyway
    words = [w for w, n in counts.most_common() if n >= min_count]
    if max_size is not None:
        words = words[: max_size - len(SPECIAL_TOKENS)]
    total = sum(counts.values())
    covered = sum(counts[w] for w in words)
    stats = {
        "sentences": sentences,
        "tokens": total,
        "distinct": len(counts),
        "vocabulary": len(words) + 3,
        "coverage": covered / total if total else 0.0,
    }
    return Vocabulary([*SPECIAL_TOKENS, *words], source="vocabulary"), stats
