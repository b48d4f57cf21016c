"""ELMoForManyLangs' input pipeline: tokens into rows of ids, exactly as its ``Embedder`` makes them.

For each sentence its ``read_list`` adds ``<bos>`` and ``<eos>`` and cuts every other token to
``max_characters_per_token - 2`` code points (Python ``str`` slicing, not bytes); its
``create_one_batch`` then gives each token

* a word id: the (cut) token's id in word.dic by exact match, else ``<oov>``'s (word_dim > 0);
* ``max_characters_per_token`` character ids: the id of ``<eow>``, the token's characters (ids
  in char.dic, ``<oov>``'s for the others), the id of ``<bow>``, then ``<pad>``'s. Its code
  names the first mark ``bow_id`` but reads ``<eow>``'s id for it (and the other way round),
  and its models were trained that way, so the marks stay swapped here. The tokens ``<bos>``
  and ``<eos>`` (the added ones, and the same strings in a sentence) are the two marks around
  their own char.dic entry instead of their characters.

A row here is ``[word id] + [character ids]`` (each part present when the model has it), every
id + 1, so that an all-zero row means "no token", which is how the biLM core tells padding from
tokens; the model's tables carry a zero row 0 to match
(:func:`~elmo_fast.formats.manylangs_dir.load_manylangs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..sentences import as_batch

BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"


class ManyLangsIds:
    """The front end of an ELMoForManyLangs model (see the module docstring).

    char_vocab, word_vocab: char.dic and word.dic (token -> the file's id); either may be None
    when the model has no character CNN or no word embedding. Rows have ``width`` ids.
    """

    _CACHE_ENTRIES = 1 << 17

    def __init__(
        self, char_vocab: Mapping[str, int] | None, word_vocab: Mapping[str, int] | None, max_characters_per_token: int
    ) -> None:
        if not char_vocab and not word_vocab:
            raise ValueError("ManyLangsIds needs a char.dic or a word.dic")
        self.max_characters_per_token = max_characters_per_token
        self.char_vocab = dict(char_vocab) if char_vocab else None
        self.word_vocab = dict(word_vocab) if word_vocab else None
        self.width = (1 if self.word_vocab else 0) + (max_characters_per_token if self.char_vocab else 0)
        ids = [*(self.char_vocab or {}).values(), *(self.word_vocab or {}).values()]
        self.max_id = max(ids) + 1
        self._cache: dict[str, tuple[int, ...]] = {}
        self.bos = self.token_ids(BOS_TOKEN)
        self.eos = self.token_ids(EOS_TOKEN)

    def __repr__(self) -> str:
        parts = []
        if self.word_vocab:
            parts.append(f"words={len(self.word_vocab)}")
        if self.char_vocab:
            parts.append(f"characters={len(self.char_vocab)}")
        return f"ManyLangsIds({', '.join(parts)}, max_characters_per_token={self.max_characters_per_token})"

    def token_ids(self, token: str) -> tuple[int, ...]:
        """The row of one token (``width`` ids, each + 1)."""
        row = self._cache.get(token)
        if row is None:
            row = self._token_ids(token)
            if len(self._cache) >= self._CACHE_ENTRIES:
                self._cache.clear()
            self._cache[token] = row
        return row

    def _token_ids(self, token: str) -> tuple[int, ...]:
        m = self.max_characters_per_token
        if len(token) + 2 > m:
            token = token[: m - 2]
        row: list[int] = []
        if self.word_vocab:
            words = self.word_vocab
            row.append(words.get(token, words["<oov>"]) + 1)
        if self.char_vocab:
            chars = self.char_vocab
            oov = chars["<oov>"]
            inner = [chars[token]] if token in (BOS_TOKEN, EOS_TOKEN) else [chars.get(c, oov) for c in token]
            marked = [chars["<eow>"], *inner, chars["<bow>"]]  # swapped, as in create_one_batch
            row += [i + 1 for i in marked] + [chars["<pad>"] + 1] * (m - len(marked))
        return tuple(row)

    def batch_to_ids(self, batch: Sequence[Sequence[str]]) -> Tensor:
        """LongTensor [B, T, width] of a batch of tokenized sentences; rows past a sentence's end are zeros."""
        batch = as_batch(batch, "batch_to_ids")
        longest = max((len(s) for s in batch), default=0)
        out = torch.zeros(len(batch), longest, self.width, dtype=torch.long)
        for i, sentence in enumerate(batch):
            if sentence:
                out[i, : len(sentence)] = torch.tensor([self.token_ids(t) for t in sentence], dtype=torch.long)
        return out
