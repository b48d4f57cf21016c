"""allennlp's ELMoCharacterMapper restated byte by byte, independent of elmo_fast's helpers (see
tests/bilm/test_char_ids.py): the expected character ids of a token and of a batch."""

from __future__ import annotations

WORD_LEN = 50


def spec_token(token: str) -> list[int]:
    if token == "<S>":
        raw = [258, 256, 259]
    elif token == "</S>":
        raw = [258, 257, 259]
    else:
        raw = [258, *token.encode("utf-8", "ignore")[:48], 259]
    raw += [260] * (WORD_LEN - len(raw))
    assert len(raw) == WORD_LEN
    return [c + 1 for c in raw]


def spec_batch(batch: list[list[str]]) -> list[list[list[int]]]:
    longest = max((len(s) for s in batch), default=0)
    return [[spec_token(t) for t in s] + [[0] * WORD_LEN] * (longest - len(s)) for s in batch]
