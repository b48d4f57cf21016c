"""``allennlp.data.token_indexers.elmo_indexer``: ``ELMoCharacterMapper`` (a token's 50 character ids)
and ``ELMoTokenCharactersIndexer`` (tokens -> rows of them), on elmo-fast's character ids
(:mod:`elmo_fast.bilm.char_ids`: the same ids, tested against allennlp's).

The indexer stands alone here (allennlp's ``TokenIndexer`` base, ``Vocabulary`` and ``Token`` are off
ELMo's path): tokens are anything with a ``.text`` (allennlp's ``Token``, spaCy's) or str.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...bilm import char_ids as ids
from ...errors import ConfigurationError


def _mark_token(character: int) -> list[int]:
    row = [ids.PADDING_CHARACTER] * ids.MAX_WORD_LENGTH
    row[0], row[1], row[2] = ids.BEGINNING_OF_WORD_CHARACTER, character, ids.END_OF_WORD_CHARACTER
    return row


class ELMoCharacterMapper:
    """allennlp's mapper: ``convert_word_to_char_ids(word)`` -> 50 ids (+1 shifted, 0 = no token);
    ``tokens_to_add`` maps special tokens to a character id of their own."""

    max_word_length = ids.MAX_WORD_LENGTH
    beginning_of_sentence_character = ids.BEGINNING_OF_SENTENCE_CHARACTER
    end_of_sentence_character = ids.END_OF_SENTENCE_CHARACTER
    beginning_of_word_character = ids.BEGINNING_OF_WORD_CHARACTER
    end_of_word_character = ids.END_OF_WORD_CHARACTER
    padding_character = ids.PADDING_CHARACTER
    # (not shifted, as allennlp keeps them)
    beginning_of_sentence_characters = _mark_token(ids.BEGINNING_OF_SENTENCE_CHARACTER)
    end_of_sentence_characters = _mark_token(ids.END_OF_SENTENCE_CHARACTER)
    bos_token = ids.BOS_TOKEN
    eos_token = ids.EOS_TOKEN

    def __init__(self, tokens_to_add: dict[str, int] | None = None) -> None:
        self.tokens_to_add = tokens_to_add or {}

    def convert_word_to_char_ids(self, word: str) -> list[int]:
        if word in self.tokens_to_add:
            return [c + 1 for c in _mark_token(self.tokens_to_add[word])]
        return list(ids.word_to_char_ids(word))

    def __eq__(self, other) -> bool:
        if isinstance(self, other.__class__):
            return self.__dict__ == other.__dict__
        return NotImplemented


class ELMoTokenCharactersIndexer:
    """allennlp's ``elmo_characters`` indexer: ``tokens_to_indices(tokens, vocabulary, index_name)`` ->
    ``{index_name: [50 ids per token]}``; ``as_padded_tensor`` pads with all-zero rows."""

    def __init__(
        self,
        namespace: str = "elmo_characters",
        tokens_to_add: dict[str, int] | None = None,
        token_min_padding_length: int = 0,
    ) -> None:
        self._namespace = namespace
        self._mapper = ELMoCharacterMapper(tokens_to_add)
        self._token_min_padding_length = token_min_padding_length

    def count_vocab_items(self, token: Any, counter: dict[str, dict[str, int]]) -> None:
        pass  # character ids need no vocabulary

    def tokens_to_indices(
        self, tokens: Sequence[Any], vocabulary: Any = None, index_name: str = "elmo_characters"
    ) -> dict[str, list[list[int]]]:
        texts = [token if isinstance(token, str) else getattr(token, "text", None) for token in tokens]
        if any(text is None for text in texts):
            raise ConfigurationError("ELMoTokenCharactersIndexer needs a tokenizer that retains text")
        return {index_name: [self._mapper.convert_word_to_char_ids(text) for text in texts]}

    def get_padding_lengths(self, token: list[int]) -> dict[str, int]:
        return {}

    def get_token_min_padding_length(self) -> int:
        return self._token_min_padding_length

    @staticmethod
    def _default_value_for_padding() -> list[int]:
        return [0] * ELMoCharacterMapper.max_word_length

    def as_padded_tensor(
        self,
        tokens: dict[str, list[list[int]]],
        desired_num_tokens: dict[str, int],
        padding_lengths: dict[str, int] | None = None,
    ) -> dict[str, torch.Tensor]:
        out = {}
        for key, rows in tokens.items():
            n = desired_num_tokens[key]
            rows = list(rows[:n]) + [self._default_value_for_padding() for _ in range(n - len(rows))]
            out[key] = torch.tensor(rows, dtype=torch.long).view(n, ELMoCharacterMapper.max_word_length)
        return out

    def __eq__(self, other) -> bool:
        if isinstance(self, other.__class__):
            return self.__dict__ == other.__dict__
        return NotImplemented
