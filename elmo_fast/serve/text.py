"""Raw text into tokens, the one place the server does it: ``"texts"`` of ``POST /embed``, ``"input"`` of
``POST /v1/embeddings`` and ``POST /tokenize`` all go through :func:`split`, which is every front's rule,
:func:`elmo_fast.tokenizer.split_text`, for raw text (``tokenize=True``: as ``embed --tokenize``). :func:`split_with_offsets` gives each token's
place in the text too (the tokenizer only segments: every token is a piece of the text, in order)."""

from __future__ import annotations

from ..tokenizer import split_text


def split(text: str) -> list[str]:
    """The tokens a text is embedded as (these fields are raw text by name: always tokenized)."""
    return split_text(text, tokenize=True)


def split_with_offsets(text: str) -> list[tuple[str, int, int]]:
    """``(token, start, stop)`` for each token of :func:`split`: ``text[start:stop] == token`` (character
    offsets, Python string indices)."""
    out, pos = [], 0
    for token in split(text):
        start = text.index(token, pos)  # the next token starts at the next non-space character
        pos = start + len(token)
        out.append((token, start, pos))
    return out
