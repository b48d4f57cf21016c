"""Cases of the char CNN's tests: filter sets, random weights, ELMo-like character ids (every byte
length, the sentence marks, "no token" rows), awkward words, and where a max window is too close to call."""

import math
import random

import torch
import torch.nn.functional as F

from elmo_fast import batch_to_ids
from elmo_fast.bilm.char_ids import BOS_TOKEN, EOS_TOKEN
from elmo_fast.formats.random_models import PRESETS

ELMO_FILTERS = PRESETS["small"].filters  # the small and original models' char CNN (D = 16)
TINY_FILTERS = PRESETS["tiny"].filters
FULL_FILTERS = PRESETS["original"].filters


def random_cnn(filters, dim, dtype, seed, vocab=262):
    """Embedding [V, D] (row 0 zero, as ELMo's), K weights [n, D, w] and biases [n], outputs ~1."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(vocab, dim, generator=gen, dtype=torch.float64)
    emb[0] = 0
    weights = [torch.randn(n, dim, w, generator=gen, dtype=torch.float64) / (w * dim) ** 0.5 for w, n in filters]
    biases = [0.3 * torch.randn(n, generator=gen, dtype=torch.float64) for _, n in filters]
    return emb.to(dtype), [w.to(dtype) for w in weights], [b.to(dtype) for b in biases]


def random_word(n_bytes, rng):
    """A string of exactly n_bytes UTF-8 bytes mixing 1-, 2-, 3- and 4-byte characters."""
    chars = []
    left = n_bytes
    while left:
        size = rng.choice([s for s in (1, 1, 1, 2, 3, 4) if s <= left])
        chars.append(
            {
                1: rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;'-"),
                2: rng.choice("éüñçßøΩжא"),
                3: rng.choice("日本語€中文ह"),
                4: rng.choice("😀🙂𝄞🚀"),
            }[size]
        )
        left -= size
    word = "".join(chars)
    assert len(word.encode("utf-8")) == n_bytes
    return word


def elmo_ids(n, seed):
    """[n, 50] ids as batch_to_ids makes them: every byte length 0..60 (cut to 48 by the mapper), the
    sentence marks, multibyte text, and all-zero "no token" rows (padding of shorter sentences)."""
    rng = random.Random(seed)
    words = [random_word(length, rng) for length in range(61)]
    words += [BOS_TOKEN, EOS_TOKEN, "naïve", "Ça", "日本語", "🙂", "a", ".", "the", "Prevention", "U.S."]
    sentences = [rng.sample(words, 12), ["x"]]  # the second pads with 11 no-token rows
    while sum(len(s) for s in sentences) < n:
        sentences.append(rng.sample(words, rng.randint(1, 12)))
    ids = batch_to_ids(sentences).view(-1, 50)  # rows of shorter sentences are zero
    ids = ids[torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(seed))[:n]]
    if n >= 7:
        ids[-1] = 0  # at least one no-token row
    return ids


AWKWARD_WORDS = [
    "a",
    "I",
    "the",
    ",",
    "über",
    "東京",
    "aaaaaaaaaaaa",
    "x" * 60,
    "supercalifragilistic",
    "<S>",
    "</S>",
    "mississippi",
    "ab" * 30,
    "zz",
]


def char_cnn_inputs(filters, dim, dtype, seed, n_random=5, chars=50, vocab=262):
    """ids [N, chars] of real words (ELMo's padding runs), full-length words (no run), an empty row
    (all zeros: one run), rows of random ids (no run) and rows ending in a run of a real character;
    weights of the given (width, count) filters."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    if chars == 50:
        rows.append(batch_to_ids([AWKWARD_WORDS])[0])
    rows.append(torch.zeros(1, chars, dtype=torch.long))
    rows.append(torch.randint(1, vocab, (n_random, chars), generator=g))
    tail = torch.randint(1, vocab, (3, chars), generator=g)
    for r, start in enumerate((min(1, chars - 1), chars // 2, chars - 1)):
        tail[r, start:] = tail[r, start]
    rows.append(tail)
    ids = torch.cat(rows)
    emb = torch.randn(vocab, dim, generator=g, dtype=torch.float64)
    emb[0] = 0
    ws = [
        torch.randn(num, dim, width, generator=g, dtype=torch.float64) / math.sqrt(width * dim)
        for width, num in filters
    ]
    bs = [torch.randn(num, generator=g, dtype=torch.float64) * 0.1 for _, num in filters]
    return ids, emb.to(dtype), [w.to(dtype) for w in ws], [b.to(dtype) for b in bs]


def near_ties(ids, emb, weights, biases, activation, margin):
    """[N, sum n_k] True where a filter's max window is not clear by `margin` (float64 values): the
    largest and the next distinct value are closer, or (relu) the max is that close to 0. There an
    fp32 kernel and the float64 reference may pick different windows; gradients are masked there."""
    x = F.embedding(ids, emb.double()).transpose(1, 2)
    masks = []
    for w, b in zip(weights, biases):
        v = F.conv1d(x, w.double(), b.double())  # [N, n, windows]
        top = v.amax(dim=-1, keepdim=True)
        below = torch.where(v < top, v, torch.full_like(v, -torch.inf)).amax(dim=-1)
        ambiguous = (top.squeeze(-1) - below) < margin
        if activation == "relu":
            ambiguous |= top.squeeze(-1).abs() < margin
        masks.append(ambiguous)
    return torch.cat(masks, dim=1)
