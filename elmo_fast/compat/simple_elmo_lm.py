"""simple_elmo's ``get_elmo_substitutes``: the biLM's language-model predictions for each word.

What simple_elmo 0.9.2 computes (``quirks=True``), read from its source and checked against it:

* The sentences are streamed the way bilm-tf's training reads text: ``max_batch_size`` rows, one
  token per row per step; a row that finishes its sentence takes the next unread one. Fewer
  sentences than rows is an error (``SystemError``, "Batch size must be less than the number of
  input sentences!").
* **No context.** Every step starts from zero LSTM states (simple_elmo keeps the initial states
  and never feeds back the final ones), so a prediction depends on the one input token only: the
  "forward" candidates for word k come from word k-1 alone (``<S>`` for the first word), the
  "backward" ones from word k+1 alone (``</S>`` for the last).
* **Scores are logits**, not log-probabilities: ``logp`` is ``h W^T + b`` of the top LSTM layer
  (the softmax is never applied), rounded to 4 decimals.
* ``nodelimiters=True`` sets the scores of vocabulary ids 0 and 1 (``</S>`` and ``<S>`` in
  bilm-tf's vocabulary order) to 0 before picking, rather than removing them: with every other
  logit negative they still win.
* The ``topn`` candidates of a position are ``np.argpartition(scores, -topn)[-topn:]``: the best
  ``topn``, **not sorted** (numpy's partition order, which this reproduces on the same scores).
* **Sentences come out in the order they finish, and some never do**: a sentence is appended when
  its row reaches its end; the batch in which the stream runs dry is dropped whole, so the last
  sentences in flight are missing (with as many sentences as rows, only the shortest ones come back).
* ``word`` is the vocabulary's form of the word (``<UNK>`` for unknown words).

``quirks=False`` (elmo-fast's): every sentence, in input order; each word's forward candidates
from the forward LM over all the words before it, the backward ones from the backward LM over all
the words after it (the biLM run over the whole sentence from zero states); ``logp`` true
log-probabilities (log-softmax over the vocabulary), rounded to 4 decimals, best first;
``nodelimiters`` leaves ``<S>`` and ``</S>`` (by their ids in the vocabulary) out of the candidates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..bilm.model import ElmoBiLm
from ..errors import InputError
from .simple_elmo_vocab import BOS, EOS, UnicodeCharsVocabulary

_SCORES_PER_PASS = 1 << 24  # scores [rows, V] in memory at once (64 MB of float32)


class SimpleElmoBatchError(InputError, SystemError):
    """simple_elmo's ``SystemError`` for fewer sentences than ``max_batch_size``; an
    :class:`~elmo_fast.errors.InputError` too."""


class LanguageModelHead:
    """The biLM's top layer through the softmax: ``scores = h W^T + b`` for each direction."""

    def __init__(self, bilm: ElmoBiLm, weight: Tensor, bias: Tensor) -> None:
        self.bilm, self.weight, self.bias = bilm, weight, bias
        self.P = bilm.options.projection_dim

    @torch.inference_mode()
    def one_token_scores(self, rows: np.ndarray) -> tuple[Tensor, Tensor]:
        """rows [U, max_chars] (character ids, + 1) -> forward and backward scores [U, V] float32,
        each direction's LM run on the token alone from zero states."""
        bilm = self.bilm
        ids = torch.from_numpy(rows).to(bilm.device)
        vectors = bilm.token_embedder(ids).float()  # [U, P]
        lengths = torch.ones(len(rows), dtype=torch.long, device=bilm.device)
        outputs, _, _ = bilm.encoder.forward_sequence(vectors[:, None, :], lengths)  # [L, U, 1, 2P]
        top = outputs[-1, :, 0].float()
        return self.scores(top[:, : self.P]), self.scores(top[:, self.P :])

    def scores(self, h: Tensor) -> Tensor:
        return torch.addmm(self.bias, h, self.weight.t())


def _stream(
    sentences: list[str], vocab: UnicodeCharsVocabulary, reverse: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """bilm-tf's ``lm_encode``: (word ids, character rows) of each sentence, the boundaries included."""
    for sentence in sentences:
        words = sentence.split()
        if reverse:
            words = words[::-1]
        yield vocab.encode(words, reverse=reverse, split=False), vocab.encode_chars(words, reverse=reverse, split=False)


def _steps(
    sentences: list[str], vocab: UnicodeCharsVocabulary, rows: int, reverse: bool
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """bilm-tf's ``_get_batch`` with one step per batch: per step, each row's input character row
    [rows, max_chars] and target word id [rows]. Ends, dropping the step, when a row finds no
    sentence left."""
    stream = _stream(sentences, vocab, reverse)
    current: list[list | None] = [None] * rows
    while True:
        chars = np.zeros((rows, vocab.max_word_length), dtype=np.int32)
        targets = np.zeros(rows, dtype=np.int32)
        exhausted = False
        for i in range(rows):
            if current[i] is None or len(current[i][0]) <= 1:
                try:
                    current[i] = list(next(stream))
                except StopIteration:
                    exhausted = True
                    continue
            ids, char_rows = current[i]
            chars[i], targets[i] = char_rows[0], ids[1]
            current[i] = [ids[1:], char_rows[1:]]
        if exhausted:
            return
        yield chars, targets


class _TopByRow:
    """The top-``topn`` (ids, rounded scores) of one-token predictions, computed once per distinct
    input row: with zero states a prediction depends on the input token alone."""

    def __init__(self, lm: LanguageModelHead, topn: int, nodelimiters: bool) -> None:
        self.lm, self.topn, self.nodelimiters = lm, topn, nodelimiters
        self.known: dict[bytes, tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, rows: Sequence[np.ndarray]) -> None:
        new = list({r.tobytes(): r for r in rows if r.tobytes() not in self.known}.items())
        step = max(1, _SCORES_PER_PASS // self.lm.weight.shape[0])
        for start in range(0, len(new), step):
            part = new[start : start + step]
            forward, backward = self.lm.one_token_scores(np.stack([r for _, r in part]).astype(np.int64) + 1)
            picked = [self._top(s.cpu().numpy()) for s in (forward, backward)]
            for j, (key, _) in enumerate(part):
                self.known[key] = ((picked[0][0][j], picked[0][1][j]), (picked[1][0][j], picked[1][1][j]))

    def _top(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.nodelimiters:
            scores[:, 0] = 0
            scores[:, 1] = 0
        ind = np.argpartition(scores, -self.topn)[:, -self.topn :]
        return ind, np.round(np.take_along_axis(scores, ind, 1).astype(float), 4)

    def __getitem__(self, row: np.ndarray):
        return self.known[row.tobytes()]


def substitutes_as_simple_elmo(
    data: list[str],
    vocab: UnicodeCharsVocabulary,
    lm: LanguageModelHead,
    batch_size: int,
    topn: int,
    nodelimiters: bool,
) -> list[list[dict]]:
    """simple_elmo's ``get_elmo_substitutes``, step for step (see the module docstring)."""
    if len(data) < batch_size:
        raise SimpleElmoBatchError(
            "Batch size must be less than the number of input sentences! (got "
            f"{len(data)} sentences for max_batch_size={batch_size})"
        )
    top = _TopByRow(lm, topn, nodelimiters)
    top.add(
        [
            row
            for sentence in data
            for reverse in (False, True)
            for row in vocab.encode_chars(
                sentence.split()[::-1] if reverse else sentence.split(), reverse=reverse, split=False
            )
        ]
    )
    predictions: list[list[dict]] = []
    storage: list[tuple[list, list]] = [([], []) for _ in range(batch_size)]
    for (chars, targets), (chars_r, targets_r) in zip(
        _steps(data, vocab, batch_size, False), _steps(data, vocab, batch_size, True)
    ):
        for nr in range(batch_size):
            word, word_r = vocab.id_to_word(int(targets[nr])), vocab.id_to_word(int(targets_r[nr]))
            if word == EOS and word_r == BOS:
                predictions.append(_merge(storage[nr]))
                storage[nr] = ([], [])
                continue
            for side, row, target in ((0, chars[nr], word), (1, chars_r[nr], word_r)):
                ind, logp = top[row][side]
                storage[nr][side].append(
                    {
                        "word": target,
                        "candidates": ind.tolist(),
                        "candidate_words": [vocab.id_to_word(int(i)) for i in ind],
                        "logp": logp.tolist(),
                    }
                )
    return predictions


def _merge(sentence: tuple[list, list]) -> list[dict]:
    forward, backward = sentence
    return [
        {
            "word": f["word"],
            "forward": {k: v for k, v in f.items() if k != "word"},
            "backward": {k: v for k, v in b.items() if k != "word"},
        }
        for f, b in zip(forward, reversed(backward))
    ]


@torch.inference_mode()
def substitutes_in_context(
    data: list[str],
    vocab: UnicodeCharsVocabulary,
    lm: LanguageModelHead,
    batch_size: int,
    topn: int,
    nodelimiters: bool,
) -> list[list[dict]]:
    """Every sentence, in order, each word predicted from its whole left (forward) and right
    (backward) context, with log-probabilities, best first."""
    bilm = lm.bilm
    P = lm.P
    out: list[list[dict]] = []
    for start in range(0, len(data), batch_size):
        chunk = [s.split() for s in data[start : start + batch_size]]
        longest = max(len(s) for s in chunk)
        ids = np.zeros((len(chunk), longest, vocab.max_word_length), dtype=np.int64)
        for k, words in enumerate(chunk):
            for t, w in enumerate(words):
                ids[k, t] = vocab.word_to_char_ids(w) + 1
        bilm.reset_states()  # from zero states, whatever the biLM carried
        top = bilm(torch.from_numpy(ids))["activations"][-1].float()  # [B, T + 2, 2P], boundaries included
        bilm.reset_states()
        for k, words in enumerate(chunk):
            n = len(words)
            sides = []
            for h in (top[k, 0:n, :P], top[k, 2 : n + 2, P:]):  # predicting words 1..n
                logp = torch.log_softmax(lm.scores(h), dim=-1)
                if nodelimiters:
                    logp[:, [vocab.bos, vocab.eos]] = float("-inf")
                values, ind = logp.topk(topn, dim=-1)
                sides.append((ind.cpu().numpy(), np.round(values.cpu().double().numpy(), 4)))
            sentence = []
            for t, w in enumerate(words):
                entry = {"word": vocab.id_to_word(vocab.word_to_id(w))}
                for name, (ind, values) in zip(("forward", "backward"), sides):
                    entry[name] = {
                        "candidates": ind[t].tolist(),
                        "candidate_words": [vocab.id_to_word(int(i)) for i in ind[t]],
                        "logp": values[t].tolist(),
                    }
                sentence.append(entry)
            out.append(sentence)
    return out
