"""Character ids, exactly as allennlp's ``ELMoCharacterMapper`` / ``batch_to_ids`` make them.

A token becomes 50 ids: begin-of-word (258), its UTF-8 bytes cut to 48, end-of-word (259),
then padding (260); the literal tokens ``<S>`` and ``</S>`` get the sentence marks 256 / 257
instead of their bytes. Every id is then shifted by +1 so that 0 can mean "no token here".
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import Tensor

from ..sentences import as_batch

MAX_WORD_LENGTH = 50
BEGINNING_OF_SENTENCE_CHARACTER = 256  # <begin sentence>
END_OF_SENTENCE_CHARACTER = 257  # <end sentence>
BEGINNING_OF_WORD_CHARACTER = 258  # <begin word>
END_OF_WORD_CHARACTER = 259  # <end word>
PADDING_CHARACTER = 260  # <padding>
BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


def _mark_token(character: int) -> tuple[int, ...]:
    ids = [PADDING_CHARACTER] * MAX_WORD_LENGTH
    ids[0] = BEGINNING_OF_WORD_CHARACTER
    ids[1] = character
    ids[2] = END_OF_WORD_CHARACTER
    return tuple(i + 1 for i in ids)


#: The (already +1 shifted) ids of the sentence-boundary tokens the model adds around a sentence.
BOS_CHAR_IDS = _mark_token(BEGINNING_OF_SENTENCE_CHARACTER)
EOS_CHAR_IDS = _mark_token(END_OF_SENTENCE_CHARACTER)


@lru_cache(maxsize=65536)
def word_to_char_ids(word: str) -> tuple[int, ...]:
    """The 50 (+1 shifted) character ids of one token."""
    if word == BOS_TOKEN:
        return BOS_CHAR_IDS
    if word == EOS_TOKEN:
        return EOS_CHAR_IDS
    # "ignore" only drops what UTF-8 cannot encode (lone surrogates), as allennlp does.
    encoded = word.encode("utf-8", "ignore")[: MAX_WORD_LENGTH - 2]
    ids = [PADDING_CHARACTER] * MAX_WORD_LENGTH
    ids[0] = BEGINNING_OF_WORD_CHARACTER
    ids[1 : len(encoded) + 1] = encoded
    ids[len(encoded) + 1] = END_OF_WORD_CHARACTER
    return tuple(i + 1 for i in ids)


def batch_to_ids(batch: Sequence[Sequence[str]]) -> Tensor:
    """Character ids of a batch of tokenized sentences.

    batch:   B sentences, each a sequence of tokens (str): lists, tuples, numpy arrays of str
             (:mod:`elmo_fast.sentences`; anything else is a one-line error, a TypeError).
    returns  LongTensor [B, T, 50], T the longest sentence's length; token slots past a
             sentence's end are all zeros.
    """
    batch = as_batch(batch, "batch_to_ids")
    longest = max((len(s) for s in batch), default=0)
    out = torch.zeros(len(batch), longest, MAX_WORD_LENGTH, dtype=torch.long)
    for i, sentence in enumerate(batch):
        if sentence:
            out[i, : len(sentence)] = torch.tensor([word_to_char_ids(t) for t in sentence], dtype=torch.long)
    return out


class AllenNlpCharIds:
    """The front end of bilm-tf / allennlp models, as the biLM core uses one: a token's row of ids
    (:func:`word_to_char_ids`), the rows of the sentence boundaries the model adds, a batch's ids.

    Another front end (:class:`~elmo_fast.bilm.word_char_ids.ManyLangsIds`) gives the same four
    things for its models; rows are +1 shifted so that an all-zero row means "no token".
    """

    #: ids per token
    width = MAX_WORD_LENGTH
    #: the rows of ``<S>`` and ``</S>``, added around every sentence by the model
    bos = BOS_CHAR_IDS
    eos = EOS_CHAR_IDS
    #: the largest id a row can hold
    max_id = PADDING_CHARACTER + 1

    def token_ids(self, token: str) -> tuple[int, ...]:
        return word_to_char_ids(token)

    def batch_to_ids(self, batch: Sequence[Sequence[str]]) -> Tensor:
        return batch_to_ids(batch)

    def __repr__(self) -> str:
        return "AllenNlpCharIds(width=50)"
