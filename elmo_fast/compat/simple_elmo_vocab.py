"""simple_elmo's vocabulary and ``Batcher`` (its ``data.py``, from bilm-tf): tokens to character ids,
the way simple_elmo 0.9.2 makes them, quirks included.

A token's row of character ids is ``[bow, its UTF-8 bytes (at most max_chars - 2), eow, pad, ...]``,
plus 1 (0 is padding): allennlp's and bilm-tf's ids. The vocabulary only caches these rows for its
first ``limit`` words, with two exceptions that make it matter which words it holds:

* the rows of the entries ``<S>`` and ``</S>`` are the sentence-boundary rows
  ``[bow, bos_char or eos_char, eow, pad, ...]``, so a token ``<S>`` or ``</S>`` in a text gets
  them (as in allennlp); without a vocabulary file simple_elmo uses ``<S>``, ``</S>``, ``<UNK>``;
* when ``<S>`` (or ``</S>``) is not among the first ``limit`` words, its index is -1, and numpy's
  index -1 is the **last cached word**: that word's row becomes the boundary row (``</S>``'s, when
  both are missing). A text holding that word gets the sentence-end row for it.

``limit`` counts lines read (a ``!!!MAXTERMID`` line is skipped and not counted); ``limit=0`` or
``None`` reads the whole file, as simple_elmo's ``idx == limit`` test never stops at 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import ModelFileError

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
#: simple_elmo's vocabulary when the model has no vocabulary file
DEFAULT_TOKENS = (BOS, EOS, UNK)
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
_MEMO_LIMIT = 1 << 18  # rows of tokens outside the vocabulary kept between batches


class Vocabulary:
    """simple_elmo's ``Vocabulary``: tokens and ids, read from lines (None: the three specials).

    ``bos``, ``eos``, ``unk`` are -1 when absent (``validate=True`` refuses that, naming ``source``).
    """

    def __init__(
        self, lines: Iterable[str] | None, limit: int | None = None, validate: bool = False, source: str = "vocabulary"
    ) -> None:
        self._id_to_word: list[str] = []
        self._word_to_id: dict[str, int] = {}
        self._bos = self._eos = self._unk = -1
        idx = 0
        for line in DEFAULT_TOKENS if lines is None else lines:
            word = line.strip()
            if word == BOS:
                self._bos = idx
            elif word == EOS:
                self._eos = idx
            elif word == UNK:
                self._unk = idx
            if word == "!!!MAXTERMID":
                continue
            self._id_to_word.append(word)
            self._word_to_id[word] = idx
            idx += 1
            if idx == limit:
                break
        if validate and -1 in (self._bos, self._eos, self._unk):
            missing = [t for t, i in ((BOS, self._bos), (EOS, self._eos), (UNK, self._unk)) if i == -1]
            raise ModelFileError(
                f"{source}: the vocabulary lacks {', '.join(missing)} (the language model's "
                f"vocabulary must hold {BOS}, {EOS} and {UNK})"
            )

    @property
    def bos(self) -> int:
        return self._bos

    @property
    def eos(self) -> int:
        return self._eos

    @property
    def unk(self) -> int:
        return self._unk

    @property
    def size(self) -> int:
        return len(self._id_to_word)

    def word_to_id(self, word: str) -> int:
        return self._word_to_id.get(word, self._unk)

    def id_to_word(self, cur_id: int) -> str:
        return self._id_to_word[cur_id]

    def decode(self, cur_ids: Iterable[int]) -> str:
        return " ".join(self.id_to_word(i) for i in cur_ids)

    def encode(self, sentence: str | Sequence[str], reverse: bool = False, split: bool = True) -> np.ndarray:
        """Word ids with the boundaries: [bos, words..., eos] ([eos, ..., bos] with ``reverse``)."""
        words = sentence.split() if split else sentence
        ids = [self.word_to_id(w) for w in words]
        ends = (self._eos, self._bos) if reverse else (self._bos, self._eos)
        return np.array([ends[0], *ids, ends[1]], dtype=np.int32)


class UnicodeCharsVocabulary(Vocabulary):
    """simple_elmo's ``UnicodeCharsVocabulary``: also each word's row of character ids (ids
    without the +1 of :class:`Batcher`), cached for the vocabulary's words."""

    def __init__(self, lines: Iterable[str] | None, max_word_length: int, **kwargs) -> None:
        super().__init__(lines, **kwargs)
        if not self._id_to_word:
            raise ModelFileError(f"{kwargs.get('source', 'vocabulary')}: the vocabulary file holds no token")
        self._max_word_length = max_word_length
        self.bos_char, self.eos_char, self.bow_char, self.eow_char, self.pad_char = (
            BOS_CHAR,
            EOS_CHAR,
            BOW_CHAR,
            EOW_CHAR,
            PAD_CHAR,
        )
        self.bos_chars = self._boundary_row(BOS_CHAR)
        self.eos_chars = self._boundary_row(EOS_CHAR)
        self._word_char_ids = np.stack([self._convert_word_to_char_ids(w) for w in self._id_to_word])
        # numpy indexing: an absent <S> or </S> (-1) overwrites the last cached word's row, as in simple_elmo
        self._word_char_ids[self._bos] = self.bos_chars
        self._word_char_ids[self._eos] = self.eos_chars

    def _boundary_row(self, char: int) -> np.ndarray:
        row = np.full(self._max_word_length, PAD_CHAR, dtype=np.int32)
        row[:3] = BOW_CHAR, char, EOW_CHAR
        return row

    @property
    def word_char_ids(self) -> np.ndarray:
        return self._word_char_ids

    @property
    def max_word_length(self) -> int:
        return self._max_word_length

    def _convert_word_to_char_ids(self, word: str) -> np.ndarray:
        code = np.full(self._max_word_length, PAD_CHAR, dtype=np.int32)
        encoded = word.encode("utf-8", "ignore")[: self._max_word_length - 2]
        code[0] = BOW_CHAR
        code[1 : len(encoded) + 1] = np.frombuffer(encoded, dtype=np.uint8)
        code[len(encoded) + 1] = EOW_CHAR
        return code

    def word_to_char_ids(self, word: str) -> np.ndarray:
        i = self._word_to_id.get(word)
        return self._word_char_ids[i] if i is not None else self._convert_word_to_char_ids(word)

    def encode_chars(self, sentence: str | Sequence[str], reverse: bool = False, split: bool = True) -> np.ndarray:
        """[len + 2, max_word_length] rows, the boundaries included (reversed order with ``reverse``)."""
        words = sentence.split() if split else sentence
        rows = [self.word_to_char_ids(w) for w in words]
        ends = (self.eos_chars, self.bos_chars) if reverse else (self.bos_chars, self.eos_chars)
        return np.vstack([ends[0], *rows, ends[1]])


class Batcher:
    """simple_elmo's ``Batcher``: sentences (sequences of tokens) to character ids, plus 1.

    ``batch_sentences`` gives simple_elmo's array: int64 [N, longest + 2, max_chars], the
    boundaries included, zeros past each sentence. :meth:`token_ids` is the same without the
    boundaries, what the biLM takes. A sentence is iterated as it is: a string is a sequence of
    one-character tokens, as in simple_elmo.
    """

    def __init__(
        self,
        vocab_lines: Iterable[str] | None,
        max_token_length: int,
        limit: int | None = None,
        source: str = "vocabulary",
    ) -> None:
        self._lm_vocab = UnicodeCharsVocabulary(vocab_lines, max_token_length, limit=limit, source=source)
        self._max_token_length = max_token_length
        self._rows: dict[str, np.ndarray] = {}

    def _row(self, token: str) -> np.ndarray:
        row = self._rows.get(token)
        if row is None:
            if len(self._rows) >= _MEMO_LIMIT:
                self._rows.clear()
            row = self._rows[token] = self._lm_vocab.word_to_char_ids(token).astype(np.int64) + 1
        return row

    def token_ids(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        """int64 [N, longest, max_chars]: each token's row plus 1, zeros past each sentence."""
        longest = max((len(s) for s in sentences), default=0)
        out = np.zeros((len(sentences), longest, self._max_token_length), dtype=np.int64)
        for k, sentence in enumerate(sentences):
            for t, token in enumerate(sentence):
                out[k, t] = self._row(token)
        return out

    def batch_sentences(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        """simple_elmo's ``batch_sentences``: int64 [N, longest + 2, max_chars], boundaries included."""
        tokens = self.token_ids(sentences)
        n, longest, width = tokens.shape
        out = np.zeros((n, longest + 2, width), dtype=np.int64)
        bos, eos = self._lm_vocab.bos_chars + 1, self._lm_vocab.eos_chars + 1
        for k, sentence in enumerate(sentences):
            length = len(sentence)
            out[k, 0] = bos
            out[k, 1 : length + 1] = tokens[k, :length]
            out[k, length + 1] = eos
        return out
