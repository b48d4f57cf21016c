"""Training data: corpora (plain or compressed text, one whitespace-tokenized sentence per line, any
number of files), cut into batches deterministically from a seed, so that a resumed run sees
exactly the batches an uninterrupted one would.

Two schemes:

* **sentences** (default): every sentence ``<S> w1 .. wT </S>`` is a row that starts from zero
  LSTM states, as elmo-fast embeds by default. Files are read one at a time (in an order shuffled
  per epoch), their sentences shuffled, sorted by length within windows of many batches (little
  padding) and cut into batches of at most ``batch_size`` sentences and ``max_tokens`` padded
  tokens; the batches of a file are then shuffled. The forward LM at positions 0..T predicts
  w1..wT, ``</S>``; the backward LM at positions 1..T+1 predicts ``<S>``, w1..wT.
* **unrolled windows** (bilm-tf's scheme, ``unroll_steps``): each row is a stream of consecutive
  sentences cut into windows of ``unroll_steps`` tokens; the LSTM states flow from one window to the
  next (no backpropagation across windows). As in bilm-tf, the backward LM reads its own stream of
  reversed sentences (``</S> wT .. w1 <S>``), in another order.

With several processes (DistributedDataParallel), every rank computes the same global batches and
takes its own rows of each; one process with ``batch_size * world_size`` sees the same batches.
"""

from __future__ import annotations

import glob
import os
import random
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from ..bilm.char_ids import BOS_TOKEN, EOS_TOKEN, MAX_WORD_LENGTH, word_to_char_ids
from ..errors import InputError, Param
from ..formats.vocab import Vocabulary
from ..textio import DEFAULT_MAX_LINE_LENGTH, iter_text_lines
from .model import Batch

#: a bucketing window holds this many batches' worth of sentences, sorted by length together
WINDOW_BATCHES = 50


def expand_corpus(patterns: str | Sequence[str], param: str = "train") -> list[str]:
    """Files named by paths or glob patterns (sorted within a pattern, in the order given), each
    existing; a pattern matching nothing is an error naming it and ``param``, the parameter that gave it."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    files: list[str] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matched = [m for m in matched if os.path.isfile(m)]
        if not matched:
            what = "no file matches" if glob.has_magic(pattern) else "file not found"
            raise InputError(Param(param), f" {pattern}: {what}")
        for m in matched:
            if m not in files:
                files.append(m)
    return files


def read_sentences(
    path: str, tokenize: Callable[[str], list[str]] | None = None, max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH
) -> list[str]:
    """The non-empty lines of one corpus file, tokens joined by single spaces; a line longer than
    ``max_line_length`` characters is an error naming the file and the line (None: no bound)."""
    out = []
    for line in iter_text_lines(path, max_line_length=max_line_length):
        tokens = tokenize(line) if tokenize else line.split()
        if tokens:
            out.append(" ".join(tokens))
    return out


def _rng(*key: int) -> random.Random:
    return random.Random(hash(tuple(key)) & 0xFFFFFFFFFFFF)


def sentence_batch(sentences: Sequence[Sequence[str]], vocab: Vocabulary) -> Batch:
    """Rows ``<S> tokens </S>`` from zero states, with both directions' targets (see the module)."""
    B = len(sentences)
    T = max((len(s) for s in sentences), default=0) + 2
    char_ids = torch.zeros(B, T, MAX_WORD_LENGTH, dtype=torch.long)
    fwd = torch.full((B, T), -1, dtype=torch.long)
    bwd = torch.full((B, T), -1, dtype=torch.long)
    lengths = torch.empty(B, dtype=torch.long)
    for b, s in enumerate(sentences):
        n = len(s)
        char_ids[b, : n + 2] = torch.tensor([word_to_char_ids(t) for t in (BOS_TOKEN, *s, EOS_TOKEN)])
        ids = torch.tensor([vocab.bos, *vocab.ids(s), vocab.eos])
        fwd[b, : n + 1] = ids[1:]
        bwd[b, 1 : n + 2] = ids[:-1]
        lengths[b] = n + 2
    return Batch(char_ids, lengths, fwd, bwd)


class SentenceBatches:
    """Deterministic sentence-level batches over the files of a corpus (see the module docstring).

    ``epoch(e, start)`` yields ``(index, sentences)`` for the global batches of epoch ``e`` from
    index ``start`` on, where ``sentences`` is this rank's share (lists of tokens)."""

    def __init__(
        self,
        files: Sequence[str],
        batch_size: int,
        max_tokens: int | None,
        seed: int,
        world_size: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        tokenize: Callable[[str], list[str]] | None = None,
        max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
    ) -> None:
        self.files = list(files)
        self.max_line_length = max_line_length
        self.global_batch = batch_size * world_size
        self.max_tokens = None if max_tokens is None else max_tokens * world_size
        self.seed, self.world_size, self.rank, self.shuffle = seed, world_size, rank, shuffle
        self.tokenize = tokenize
        self._cache: tuple[str, list[str]] | None = None

    def _lines(self, path: str) -> list[str]:
        if self._cache is None or self._cache[0] != path:
            self._cache = None  # free the previous file first
            self._cache = (path, read_sentences(path, self.tokenize, self.max_line_length))
        return self._cache[1]

    def _file_batches(self, lines: list[str], rng: random.Random) -> list[list[int]]:
        order = list(range(len(lines)))
        if self.shuffle:
            rng.shuffle(order)
        lengths = np.fromiter((lines[i].count(" ") + 1 for i in order), dtype=np.int64, count=len(order))
        batches: list[list[int]] = []
        window = self.global_batch * WINDOW_BATCHES
        for start in range(0, len(order), window):
            idx = np.asarray(order[start : start + window])
            lens = lengths[start : start + window]
            by_length = np.argsort(lens, kind="stable")
            current: list[int] = []
            longest = 0
            for j in by_length:
                n = int(lens[j]) + 2
                if current and (
                    len(current) == self.global_batch
                    or (self.max_tokens is not None and max(longest, n) * (len(current) + 1) > self.max_tokens)
                ):
                    batches.append(current)
                    current, longest = [], 0
                current.append(int(idx[j]))
                longest = max(longest, n)
            if current:
                batches.append(current)
        # every rank needs at least one row: a batch too small for that joins its neighbour
        merged: list[list[int]] = []
        for b in batches:
            if merged and len(b) < self.world_size:
                merged[-1].extend(b)
            else:
                merged.append(b)
        if len(merged) > 1 and len(merged[0]) < self.world_size:
            merged[1].extend(merged.pop(0))
        if self.shuffle:
            rng.shuffle(merged)
        return merged

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[int, list[list[str]]]]:
        files = list(self.files)
        if self.shuffle:
            _rng(self.seed, epoch).shuffle(files)
        index = 0
        for k, path in enumerate(files):
            lines = self._lines(path)
            batches = self._file_batches(lines, _rng(self.seed, epoch, k))
            if index + len(batches) <= start:  # a resumed run skips whole files without batching them
                index += len(batches)
                continue
            for batch in batches:
                if index >= start:
                    rows = sorted(batch, key=lambda i: (lines[i].count(" "), i))
                    mine = rows[self.rank :: self.world_size]
                    yield index, [lines[i].split(" ") for i in mine]
                index += 1

    def count(self, epoch: int = 0) -> int:
        """Global batches in an epoch (reads every file once)."""
        return sum(1 for _ in self.epoch(epoch))


class UnrolledWindows:
    """bilm-tf's ``_get_batch``: ``rows`` streams of sentences, windows of ``steps`` tokens.

    Each stream is fed whole sentences; a sentence contributes its tokens but the last as inputs
    and its tokens but the first as targets, so ``</S>`` is predicted and ``<S>`` of the next
    sentence follows. The backward LM reads reversed sentences from a second, independently
    shuffled stream. An epoch ends when a stream runs dry (the incomplete batch is dropped, as in
    bilm-tf); LSTM states start from zero at each epoch.
    """

    def __init__(
        self,
        files: Sequence[str],
        vocab: Vocabulary,
        rows: int,
        steps: int,
        seed: int,
        world_size: int = 1,
        rank: int = 0,
        tokenize: Callable[[str], list[str]] | None = None,
        max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
    ) -> None:
        self.files, self.vocab, self.steps, self.seed = list(files), vocab, steps, seed
        self.max_line_length = max_line_length
        self.rows = rows * world_size
        self.world_size, self.rank, self.tokenize = world_size, rank, tokenize

    def _sentences(self, epoch: int, direction: int) -> Iterator[list[str]]:
        files = list(self.files)
        _rng(self.seed, epoch, direction).shuffle(files)
        for k, path in enumerate(files):
            lines = read_sentences(path, self.tokenize, self.max_line_length)
            _rng(self.seed, epoch, direction, k).shuffle(lines)
            for line in lines:
                tokens = [BOS_TOKEN, *line.split(" "), EOS_TOKEN]
                yield tokens if direction == 0 else tokens[::-1]

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[int, Batch]]:
        streams = [self._sentences(epoch, 0), self._sentences(epoch, 1)]
        current: list[list[list[str]]] = [[[] for _ in range(self.rows)] for _ in range(2)]
        index = 0
        mine = range(self.rank, self.rows, self.world_size)
        while True:
            windows = []  # per direction: rows x (inputs, targets)
            for d in range(2):
                rows = []
                for i in range(self.rows):
                    inputs, targets = [], []
                    while len(inputs) < self.steps:
                        cur = current[d][i]
                        if len(cur) <= 1:
                            cur = next(streams[d], None)
                            if cur is None:
                                return
                            current[d][i] = cur
                        take = min(len(cur) - 1, self.steps - len(inputs))
                        inputs += cur[:take]
                        targets += cur[1 : take + 1]
                        current[d][i] = cur[take:]
                    rows.append((inputs, targets))
                windows.append(rows)
            if index >= start:
                yield index, self._batch([windows[0][i] for i in mine], [windows[1][i] for i in mine])
            index += 1

    def _batch(self, fwd_rows, bwd_rows) -> Batch:
        B, T = len(fwd_rows), self.steps
        ids = torch.empty(2, B, T, MAX_WORD_LENGTH, dtype=torch.long)
        targets = torch.empty(2, B, T, dtype=torch.long)
        for d, rows in enumerate((fwd_rows, bwd_rows)):
            for b, (inputs, tgt) in enumerate(rows):
                if d == 1:  # the backward LSTM walks a row from its end: lay the reversed stream out backwards
                    inputs, tgt = inputs[::-1], tgt[::-1]
                ids[d, b] = torch.tensor([word_to_char_ids(t) for t in inputs])
                targets[d, b] = torch.tensor(self.vocab.ids(tgt))
        return Batch(ids[0], torch.full((B,), T, dtype=torch.long), targets[0], targets[1], bwd_char_ids=ids[1])
