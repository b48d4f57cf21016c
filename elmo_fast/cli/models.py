"""``elmo-fast random-model``, ``models`` and ``demo``: models to test with, models by name, and
what contextual vectors do."""

from __future__ import annotations

import argparse
import os
import sys

from .common import param_flags


def _random_model(args: argparse.Namespace) -> int:
    from ..durable import check_writable, make_dirs
    from ..errors import ElmoFastError
    from ..formats.random_models import random_model

    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        raise ElmoFastError(f"{args.directory} is a file; give the directory to write options.json and weights.hdf5 in")
    if not args.overwrite:
        for name in ("options.json", "weights.hdf5"):
            path = os.path.join(args.directory, name)
            if os.path.lexists(path):  # it may be a real model's: never replaced unasked
                raise ElmoFastError(f"{path} already exists; pass --overwrite to replace it")
    make_dirs(args.directory, "model directory")  # before the weights are drawn: a bad path fails now
    for name in ("options.json", "weights.hdf5"):
        check_writable(os.path.join(args.directory, name), name)
    options, weights = random_model(args.preset, args.directory, seed=args.seed, exercise_clips=args.exercise_clips)
    print(f"wrote {options} and {weights}", file=sys.stderr)
    print(
        "WARNING: these weights are RANDOM: the vectors they give mean nothing. Use them to test and "
        "benchmark elmo-fast, not to embed text.",
        file=sys.stderr,
    )
    return 0


def _models(args: argparse.Namespace) -> int:
    from ..pretrained import MODEL_DESCRIPTIONS, cache_dir

    for name, text in MODEL_DESCRIPTIONS.items():
        print(f"{name:15s} {text}")
    print(f"cache: {cache_dir()} (set ELMO_FAST_CACHE to move it)")
    return 0


#: the classic check of contextual vectors: the two money "bank"s should be closer to each other
#: than either is to the river "bank", at the LSTM layers; layer 0 gives every "bank" one vector
BANK_SENTENCES = (
    ("The bank is closed on Sundays .", 1),
    ("That bank was robbed recently .", 1),
    ("Can you see that nice swan at the river bank ?", 9),
)


def bank_distances(embedder) -> list[dict[str, float]]:
    """Per layer, the cosine distances between the three "bank"s of :data:`BANK_SENTENCES`."""
    import numpy as np

    vectors = [embedder.embed_sentence(text.split())[:, i] for text, i in BANK_SENTENCES]  # each [L + 1, D]

    def cosine_distance(a, b):
        return float(1.0 - np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    return [
        {
            "money-money": cosine_distance(vectors[0][k], vectors[1][k]),
            "money1-river": cosine_distance(vectors[0][k], vectors[2][k]),
            "money2-river": cosine_distance(vectors[1][k], vectors[2][k]),
        }
        for k in range(vectors[0].shape[0])
    ]


def _demo(args: argparse.Namespace) -> int:
    from ..embedding.embedder import ElmoEmbedder

    if args.model_dir:
        from ..formats.model_dir import model_dir_files

        files = model_dir_files(args.model_dir)
        embedder, name = ElmoEmbedder(*files), args.model_dir
    else:
        from ..pretrained import BUNDLED_NAME, bundled_model

        files = bundled_model()
        embedder, name = ElmoEmbedder(files.options, files.weights), f"the bundled model '{BUNDLED_NAME}'"
    print(f"cosine distance between the vectors of 'bank' ({name}):")
    for i, (text, _) in enumerate(BANK_SENTENCES, start=1):
        print(f"  {i}. {text}")
    print(f"  {'layer':<8}{'1 vs 2 (both money)':>22}{'1 vs 3 (river)':>17}{'2 vs 3 (river)':>17}")
    for k, d in enumerate(bank_distances(embedder)):
        ok = (
            "  <- context: money banks closer"
            if k > 0 and d["money-money"] < min(d["money1-river"], d["money2-river"])
            else ("  (context-free: one vector per word)" if k == 0 else "")
        )
        print(f"  {k:<8}{d['money-money']:>22.3f}{d['money1-river']:>17.3f}{d['money2-river']:>17.3f}{ok}")
    return 0


def add_parsers(sub) -> None:
    from ..formats.random_models import PRESETS

    p = sub.add_parser("random-model", help="write a model with RANDOM weights (for tests and benchmarks)")
    p.add_argument("preset", choices=list(PRESETS), help="shapes: " + ", ".join(PRESETS))
    p.add_argument("directory", help="where to write options.json and weights.hdf5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exercise-clips", action="store_true", help="scale the LSTM so that the +-3 clips are hit")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace options.json and weights.hdf5 if DIR holds them (default: refuse)",
    )
    p.set_defaults(func=_random_model, outcome=lambda args: f"no half-written file is left in {args.directory}")

    p = sub.add_parser("models", help="list the models --model accepts (the bundled one and the official ones)")
    p.set_defaults(func=_models)

    p = sub.add_parser("demo", help="show contextual vectors at work: 'bank' in three sentences, per layer")
    p.add_argument("--model-dir", help="a model directory (default: the bundled model)")
    p.set_defaults(func=_demo, flags=param_flags(p))
