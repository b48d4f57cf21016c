"""Held-out perplexity of a biLM: sentence by sentence from zero states, with the full softmax."""

from __future__ import annotations

import math

import torch

from ..errors import InputError
from ..formats.vocab import Vocabulary
from ..textio import DEFAULT_MAX_LINE_LENGTH
from .data import SentenceBatches, sentence_batch
from .model import BidirectionalLM, unwrap


@torch.no_grad()
def evaluate(
    lm: BidirectionalLM,
    files: list[str],
    vocab: Vocabulary,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    tokenize=None,
    max_sentences: int | None = None,
    max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
) -> dict:
    """Held-out perplexity, sentence by sentence from zero states, full softmax: forward, backward and
    mean (exp of the mean of the two directions' mean cross-entropies), and the targets per direction."""
    lm = unwrap(lm)
    was_training = lm.training
    lm.eval()
    data = SentenceBatches(
        files, batch_size, None, seed=0, shuffle=False, tokenize=tokenize, max_line_length=max_line_length
    )
    sums, count, sentences = [0.0, 0.0], 0, 0
    try:
        for _, rows in data.epoch(0):
            if max_sentences is not None:
                rows = rows[: max(max_sentences - sentences, 0)]
                if not rows:
                    break
            sentences += len(rows)
            f, b, nf, nb, _, _ = lm(sentence_batch(rows, vocab).to(torch.device(device)), full_softmax=True)
            sums[0] += float(f)
            sums[1] += float(b)
            count += nf
    finally:
        lm.train(was_training)
    if count == 0:
        raise InputError(f"{', '.join(files)}: no sentences to evaluate")
    fwd, bwd = sums[0] / count, sums[1] / count
    return {"forward": math.exp(fwd), "backward": math.exp(bwd), "mean": math.exp(0.5 * (fwd + bwd)), "targets": count}
