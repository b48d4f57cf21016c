#!/usr/bin/env python
"""The numbers of a trained biLM's model card: held-out perplexity against a unigram baseline, the
"bank" check, nearest neighbours per layer, size on disk, inference speed, and the learning curve.

    python scripts/model_card.py --model-dir elmo_fast/pretrained/default \\
        --train corpus/train.txt --heldout corpus/heldout.txt \\
        --metrics run/metrics.jsonl --out card

writes OUT/card.json (every number) and OUT/learning_curve.png, and prints the card's tables in
Markdown. The unigram baseline is estimated on --train with the model's vocabulary (out-of-vocabulary
tokens as <UNK>, one </S> per sentence for the forward LM, one <S> for the backward one) and scored
on the same held-out targets as the biLM, so the two perplexities compare directly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from elmo_fast.cli.models import BANK_SENTENCES, bank_distances  # noqa: E402
from elmo_fast.embedding.embedder import ElmoEmbedder  # noqa: E402
from elmo_fast.formats.vocab import Vocabulary  # noqa: E402
from elmo_fast.textio import iter_text_lines  # noqa: E402

#: words in context whose nearest neighbours (other occurrences in held-out text) the card lists
QUERIES = (
    ("The bank is closed on Sundays .", 1),
    ("Can you see that nice swan at the river bank ?", 9),
    ("He decided to play the piano after dinner .", 3),
    ("The children went out to play in the garden .", 5),
    ("Python is a programming language with a clear syntax .", 0),
    ("The python is a large snake found in Africa and Asia .", 1),
)


def unigram_baseline(train: str, heldout: str, vocab: Vocabulary) -> dict:
    """Perplexity of the maximum-likelihood unigram over the vocabulary (add-one smoothed), on the
    targets the biLM predicts: forward w1..wT, </S>; backward <S>, w1..wT."""
    ids = vocab.ids
    counts = np.zeros(len(vocab), dtype=np.float64)
    sentences = 0
    for line in iter_text_lines(train):
        tokens = line.split()
        if not tokens:
            continue
        sentences += 1
        for i, n in Counter(ids(tokens)).items():
            counts[i] += n
    bos, eos = ids(["<S>", "</S>"])
    fwd_counts, bwd_counts = counts.copy(), counts.copy()
    fwd_counts[eos] += sentences
    bwd_counts[bos] += sentences
    logp = {d: np.log((c + 1.0) / (c.sum() + len(c))) for d, c in (("forward", fwd_counts), ("backward", bwd_counts))}
    nll = {"forward": 0.0, "backward": 0.0}
    targets = 0
    for line in iter_text_lines(heldout):
        tokens = line.split()
        if not tokens:
            continue
        t = ids(tokens)
        nll["forward"] -= logp["forward"][t].sum() + logp["forward"][eos]
        nll["backward"] -= logp["backward"][t].sum() + logp["backward"][bos]
        targets += len(t) + 1
    f, b = nll["forward"] / targets, nll["backward"] / targets
    return {"forward": math.exp(f), "backward": math.exp(b), "mean": math.exp(0.5 * (f + b)), "targets": targets}


def bilm_perplexity(model_dir: str, heldout: str) -> dict:
    from elmo_fast.bilm.model import ElmoBiLm
    from elmo_fast.formats.bilm_tf import load_model_files, load_softmax
    from elmo_fast.formats.model_dir import model_dir_files
    from elmo_fast.training.evaluate import evaluate
    from elmo_fast.training.model import BidirectionalLM
    from elmo_fast.training.softmax import SoftmaxHead

    vocab = Vocabulary.load(os.path.join(model_dir, "vocab.txt"))
    weights = load_model_files(*model_dir_files(model_dir))
    w, b = load_softmax(os.path.join(model_dir, "softmax.hdf5"), len(vocab), weights.options.projection_dim)
    lm = BidirectionalLM(ElmoBiLm.from_weights(weights), SoftmaxHead(w, b, requires_grad=False))
    with torch.inference_mode():
        return evaluate(lm, [heldout], vocab)


def nearest_neighbours(embedder: ElmoEmbedder, heldout: str, sentences: int, k: int = 5) -> list[dict]:
    """For each query word in context, its k nearest other occurrences (cosine) among the tokens of
    the first ``sentences`` held-out sentences, per layer; layer 0 over word types (context-free)."""
    pool = [line.split() for line in iter_text_lines(heldout) if line.strip()][:sentences]
    vectors = embedder.embed_sentences(pool)
    layers = None
    where: list[tuple[int, int]] = []
    per_layer: list[list[np.ndarray]] = []
    for s, v in enumerate(vectors):
        if layers is None:
            layers = v.shape[0]
            per_layer = [[] for _ in range(layers)]
        for k_ in range(layers):
            per_layer[k_].append(v[k_])
        where += [(s, i) for i in range(v.shape[1])]
    mats = [np.concatenate(m) for m in per_layer]
    mats = [m / np.linalg.norm(m, axis=1, keepdims=True).clip(1e-12) for m in mats]
    results = []
    for text, position in QUERIES:
        tokens = text.split()
        q = embedder.embed_sentence(tokens)[:, position]
        entry = {"sentence": text, "word": tokens[position], "layers": []}
        for layer in range(layers):
            qn = q[layer] / max(np.linalg.norm(q[layer]), 1e-12)
            sims = mats[layer] @ qn
            order = np.argsort(-sims)
            found, seen = [], set()
            for j in order:
                s, i = where[j]
                word = pool[s][i]
                key = word.lower() if layer == 0 else (s, i)
                if key in seen or (layer == 0 and word.lower() == tokens[position].lower()):
                    continue
                seen.add(key)
                lo, hi = max(i - 4, 0), min(i + 5, len(pool[s]))
                context = " ".join(pool[s][lo:i] + [f"[{word}]"] + pool[s][i + 1 : hi])
                found.append(
                    {"word": word, "cosine": round(float(sims[j]), 3), **({} if layer == 0 else {"context": context})}
                )
                if len(found) == k:
                    break
            entry["layers"].append(found)
        results.append(entry)
    return results


def inference_speed(embedder: ElmoEmbedder, heldout: str, sentences: int) -> dict:
    batch = [line.split() for line in iter_text_lines(heldout) if line.strip()][:sentences]
    list(embedder.embed_sentences(batch[:64]))  # warm-up
    start = time.perf_counter()
    out = list(embedder.embed_sentences(batch))
    seconds = time.perf_counter() - start
    tokens = sum(v.shape[1] for v in out)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds),
        "threads": torch.get_num_threads(),
    }


def learning_curve(metrics: str, unigram: float | None, png: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line.strip()]
    train = [(r["tokens"] / 1e6, r["train_perplexity"]) for r in rows if "train_perplexity" in r]
    held = [(r["tokens"] / 1e6, r["heldout"]["mean"]) for r in rows if "heldout" in r]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    if train:
        ax.plot(*zip(*train), lw=1, alpha=0.6, label="training (sampled softmax, per log interval)")
    if held:
        ax.plot(*zip(*held), "o-", lw=1.5, ms=3, label="held-out (full softmax, mean of both directions)")
    if unigram:
        ax.axhline(unigram, ls="--", c="gray", lw=1, label=f"unigram baseline ({unigram:.0f})")
    ax.set_yscale("log")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("perplexity")
    ax.set_title("elmo-fast 'default' biLM: learning curve")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    return {
        "heldout": [{"tokens_m": round(t, 2), "mean": round(p, 2)} for t, p in held],
        "last": rows[-1] if rows else None,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--metrics", help="the training run's metrics.jsonl (learning curve)")
    p.add_argument("--out", required=True)
    p.add_argument("--pool-sentences", type=int, default=4000, help="held-out sentences searched for neighbours")
    p.add_argument("--speed-sentences", type=int, default=2000)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    d = Path(args.model_dir)
    card: dict = {"files": {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}}
    card["size_mb"] = round(sum(card["files"].values()) / 1e6, 2)
    vocab = Vocabulary.load(d / "vocab.txt")
    card["unigram"] = unigram_baseline(args.train, args.heldout, vocab)
    card["perplexity"] = bilm_perplexity(str(d), args.heldout)
    embedder = ElmoEmbedder(d / "options.json", d / "weights.hdf5")
    card["bank"] = {"sentences": [t for t, _ in BANK_SENTENCES], "layers": bank_distances(embedder)}
    card["neighbours"] = nearest_neighbours(embedder, args.heldout, args.pool_sentences)
    card["speed"] = inference_speed(embedder, args.heldout, args.speed_sentences)
    if args.metrics:
        card["curve"] = learning_curve(args.metrics, card["unigram"]["mean"], str(out / "learning_curve.png"))
    (out / "card.json").write_text(json.dumps(card, indent=1))

    u, m = card["unigram"], card["perplexity"]
    print(f"| held-out ({m['targets']:,} targets per direction) | forward | backward | mean |\n|---|---|---|---|")
    print(f"| elmo-fast 'default' | {m['forward']:.1f} | {m['backward']:.1f} | {m['mean']:.1f} |")
    print(f"| unigram baseline | {u['forward']:.1f} | {u['backward']:.1f} | {u['mean']:.1f} |\n")
    print("| layer | bank 1 vs 2 (money, money) | 1 vs 3 (money, river) | 2 vs 3 (money, river) |\n|---|---|---|---|")
    for k, row in enumerate(card["bank"]["layers"]):
        print(f"| {k} | {row['money-money']:.3f} | {row['money1-river']:.3f} | {row['money2-river']:.3f} |")
    print()
    for q in card["neighbours"]:
        print(f'**{q["word"]}** in "{q["sentence"]}"\n')
        for k, found in enumerate(q["layers"]):
            if k == 0:
                print("- layer 0 (word types): " + ", ".join(f"{x['word']} ({x['cosine']})" for x in found))
            else:
                print(f"- layer {k}: " + "; ".join(f'"{x["context"]}" ({x["cosine"]})' for x in found[:3]))
        print()
    s = card["speed"]
    print(
        f"inference: {s['tokens_per_s']:,} tokens/s ({s['tokens']:,} tokens, {s['threads']} threads); "
        f"size {card['size_mb']} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
