"""A part-of-speech-style tagger on top of ``elmo_fast.Elmo``: ELMo inside a model that trains.

The corpus is synthetic: sentences from a small grammar whose tags follow word classes, with
ambiguous words ("walk", "run", "fish", ...) that are nouns after a determiner or an adjective and
verbs after a noun, so the tagger needs the context that ELMo's LSTM layers carry. The ELMo
representation is mixed by a learned ScalarMix (``Elmo(..., 1)``); a small MLP maps it to tags.

    python examples/tagger.py                                   # a random tiny biLM, made on the fly
    python examples/tagger.py --options options.json --weights weights.hdf5 --epochs 5
    python examples/tagger.py --fine-tune                       # train the biLM's weights too

With a random biLM the vectors mean nothing linguistically, yet the loss falls: the word identity
comes through the char CNN, and the context through the LSTM layers.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

import torch
from torch import Tensor, nn

from elmo_fast import Elmo, batch_to_ids

TAGS = ["DET", "ADJ", "NOUN", "VERB", "NUM", "PUNCT"]
WORDS = {
    "DET": ["the", "a", "every", "this", "that", "some"],
    "ADJ": ["big", "small", "red", "quiet", "old", "happy", "green"],
    "NOUN": ["dog", "cat", "river", "teacher", "city", "book", "garden", "Anna", "Berlin"],
    "VERB": ["sees", "likes", "finds", "wants", "paints", "follows"],
    "PUNCT": [".", "!", "?"],
}
#: nouns after a determiner or an adjective, verbs after a noun
AMBIGUOUS = ["walk", "run", "fish", "watch", "light", "play"]


def make_corpus(n: int, seed: int = 0) -> tuple[list[list[str]], list[list[int]]]:
    """n sentences and their tag ids: DET (ADJ)* NOUN VERB [NUM] DET (ADJ)* NOUN PUNCT, varied."""
    rng = random.Random(seed)
    sentences, tags = [], []

    def noun_phrase(words, labels):
        words.append(rng.choice(WORDS["DET"]))
        labels.append("DET")
        for _ in range(rng.choice([0, 0, 1, 2])):
            words.append(rng.choice(WORDS["ADJ"]))
            labels.append("ADJ")
        words.append(rng.choice(WORDS["NOUN"] + AMBIGUOUS))
        labels.append("NOUN")

    for _ in range(n):
        words: list[str] = []
        labels: list[str] = []
        noun_phrase(words, labels)
        words.append(rng.choice(WORDS["VERB"] + AMBIGUOUS))
        labels.append("VERB")
        if rng.random() < 0.3:
            words.append(str(rng.randint(2, 999)))
            labels.append("NUM")
        noun_phrase(words, labels)
        words.append(rng.choice(WORDS["PUNCT"]))
        labels.append("PUNCT")
        sentences.append(words)
        tags.append([TAGS.index(t) for t in labels])
    return sentences, tags


class Tagger(nn.Module):
    """Elmo (one learned mix of the biLM's layers) -> dropout -> MLP -> tag logits."""

    def __init__(
        self,
        options_file: str,
        weight_file: str,
        num_tags: int = len(TAGS),
        hidden: int = 64,
        dropout: float = 0.2,
        fine_tune: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.elmo = Elmo(options_file, weight_file, 1, requires_grad=fine_tune, dropout=dropout, backend=backend)
        self.head = nn.Sequential(nn.Linear(self.elmo.get_output_dim(), hidden), nn.ReLU(), nn.Linear(hidden, num_tags))

    def forward(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """char_ids [B, T, 50] -> logits [B, T, num_tags], mask [B, T]."""
        out = self.elmo(char_ids)
        return self.head(out["elmo_representations"][0]), out["mask"]


def batch_tensors(sentences: list[list[str]], tags: list[list[int]]) -> tuple[Tensor, Tensor]:
    """char ids [B, T, 50] and tag ids [B, T] (-100, cross_entropy's ignore_index, past each sentence)."""
    ids = batch_to_ids(sentences)
    target = torch.full(ids.shape[:2], -100, dtype=torch.long)
    for i, t in enumerate(tags):
        target[i, : len(t)] = torch.tensor(t)
    return ids, target


def loss_fn(tagger: Tagger, ids: Tensor, target: Tensor) -> Tensor:
    logits, _ = tagger(ids)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)


def train(
    tagger: Tagger, sentences, tags, steps: int, batch_size: int = 16, lr: float = 1e-2, seed: int = 0
) -> list[float]:
    """Adam on shuffled batches for ``steps`` steps; returns the loss of every step."""
    optimizer = torch.optim.Adam([p for p in tagger.parameters() if p.requires_grad], lr=lr)
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    tagger.train()
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.sample(range(len(sentences)), len(sentences))
        batch, order = order[:batch_size], order[batch_size:]
        ids, target = batch_tensors([sentences[i] for i in batch], [tags[i] for i in batch])
        loss = loss_fn(tagger, ids, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def accuracy(tagger: Tagger, sentences, tags, batch_size: int = 64) -> float:
    tagger.eval()
    right = total = 0
    for start in range(0, len(sentences), batch_size):
        ids, target = batch_tensors(sentences[start : start + batch_size], tags[start : start + batch_size])
        logits, mask = tagger(ids)
        right += int((logits.argmax(-1) == target)[mask].sum())
        total += int(mask.sum())
    return right / max(total, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--options", help="options.json of a biLM (default: a random tiny biLM)")
    parser.add_argument("--weights", help="weights.hdf5 of a biLM")
    parser.add_argument("--sentences", type=int, default=400, help="synthetic training sentences")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--fine-tune", action="store_true", help="train the biLM's weights too (reference path)")
    parser.add_argument("--backend", default="auto", choices=["auto", "fast", "reference"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if (args.options is None) != (args.weights is None):
        parser.error("give both --options and --weights, or neither (a random tiny biLM)")
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        options, weights = args.options, args.weights
        if options is None:
            from elmo_fast.formats.random_models import random_model

            options, weights = random_model("tiny", tmp, seed=args.seed)
        tagger = Tagger(str(options), str(weights), fine_tune=args.fine_tune, backend=args.backend)
    sentences, tags = make_corpus(args.sentences, seed=args.seed)
    test_sentences, test_tags = make_corpus(100, seed=args.seed + 1)
    steps_per_epoch = max(1, len(sentences) // args.batch_size)
    print(
        f"{len(sentences)} sentences, {steps_per_epoch} steps of {args.batch_size} per epoch; "
        f"held-out accuracy before training {accuracy(tagger, test_sentences, test_tags):.3f}"
    )
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        losses = train(tagger, sentences, tags, steps_per_epoch, args.batch_size, args.lr, seed=args.seed + epoch)
        print(
            f"epoch {epoch}: loss {sum(losses) / len(losses):.4f}, held-out accuracy "
            f"{accuracy(tagger, test_sentences, test_tags):.3f} ({time.perf_counter() - start:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
