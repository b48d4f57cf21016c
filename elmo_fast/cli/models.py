"""``elmo-fast random-model`` and ``elmo-fast models``: models to test with, and models by name."""
from __future__ import annotations

import argparse
import os
import sys


def _random_model(args: argparse.Namespace) -> int:
    from ..errors import ElmoFastError
    from ..testing import random_model

    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        raise ElmoFastError(f"{args.directory} is a file; give the directory to write options.json and weights.hdf5 in")
    if not args.overwrite:
        for name in ("options.json", "weights.hdf5"):
            path = os.path.join(args.directory, name)
            if os.path.lexists(path):  # it may be a real model's: never replaced unasked
                raise ElmoFastError(f"{path} already exists; pass --overwrite to replace it")
    options, weights = random_model(args.preset, args.directory, seed=args.seed, exercise_clips=args.exercise_clips)
    print(f"wrote {options} and {weights}", file=sys.stderr)
    print("WARNING: these weights are RANDOM: the vectors they give mean nothing. Use them to test and "
          "benchmark elmo-fast, not to embed text.", file=sys.stderr)
    return 0


def _models(args: argparse.Namespace) -> int:
    from ..pretrained import MODEL_DESCRIPTIONS, cache_dir

    for name, text in MODEL_DESCRIPTIONS.items():
        print(f"{name:15s} {text}")
    print(f"cache: {cache_dir()} (set ELMO_FAST_CACHE to move it)")
    return 0


def add_parsers(sub) -> None:
    from ..testing import PRESETS

    p = sub.add_parser("random-model", help="write a model with RANDOM weights (for tests and benchmarks)")
    p.add_argument("preset", choices=list(PRESETS), help="shapes: " + ", ".join(PRESETS))
    p.add_argument("directory", help="where to write options.json and weights.hdf5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exercise-clips", action="store_true", help="scale the LSTM so that the +-3 clips are hit")
    p.add_argument("--overwrite", action="store_true",
                   help="replace options.json and weights.hdf5 if DIR holds them (default: refuse)")
    p.set_defaults(func=_random_model, outcome=lambda args: f"no half-written file is left in {args.directory}")

    p = sub.add_parser("models", help="list the official models --model accepts")
    p.set_defaults(func=_models)
