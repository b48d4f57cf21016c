#!/usr/bin/env python
"""The fast path's error against the reference, with the defaults (the CPU calibration on) beside the
calibration off: the max abs error of each output layer, fast vs ``backend="reference"``, on the golden
fixture (the tiny biLM bilm-tf trained, ../shared/fixtures/bilm_tf_tiny) and on a random model of the
`original` shapes (elmo_fast.formats.random_models), in fp32 and bf16.

    python benchmarks/bench_parity.py                    # both models
    python benchmarks/bench_parity.py --models golden    # the fixture only (seconds)

"on" is what a user's process runs: the choice stored in $ELMO_FAST_CACHE for this machine, or measured
now (a fresh --cache folder measures now); "off" is every kernel's default (ELMO_FAST_CALIBRATION=off).
The sentences are the fixture's 30 (sentences.json), batched together. Prints the CPU (lscpu's model
name), the date, the command and torch's threads with the table. Nothing here asserts a bound: the
tests do (tests/bilm, tests/support/tolerances.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import cpu_name  # noqa: E402

from elmo_fast import ElmoBiLm, batch_to_ids  # noqa: E402
from elmo_fast.formats.random_models import random_model  # noqa: E402

FIXTURE = REPO.parent / "shared" / "fixtures" / "bilm_tf_tiny"


def layer_errors(got: dict, want: dict) -> list[float]:
    """max |fast - reference| of each output layer over the real tokens (padding left out)."""
    mask = want["mask"].bool()
    return [
        (g[mask].double() - w[mask].double()).abs().max().item()
        for g, w in zip(got["activations"], want["activations"])
    ]


def run(files: tuple[Path, Path], ids: torch.Tensor, want: dict, precision: str, calibration: str):
    """(each layer's max abs error against ``want``, the kernels' choice) of the fast path."""
    os.environ["ELMO_FAST_CALIBRATION"] = calibration
    with torch.no_grad():
        bilm = ElmoBiLm(*files, backend="fast", precision=precision)
        got = bilm(ids)
    return layer_errors(got, want), json.dumps(bilm.cpu_tuning().to_dict(), separators=(",", ":"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["golden", "original"], choices=["golden", "original"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--fixture", type=Path, default=FIXTURE, help="the golden fixture's folder")
    parser.add_argument("--cache", help="ELMO_FAST_CACHE for this run (default: the user's)")
    args = parser.parse_args()
    if args.cache:
        os.environ["ELMO_FAST_CACHE"] = args.cache
    sentences = [s.split() for group in json.loads((args.fixture / "sentences.json").read_text()) for s in group]
    ids = batch_to_ids(sentences)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"bench_parity: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, load {load:.1f}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    print(f"command: python {shlex.join(['benchmarks/bench_parity.py', *sys.argv[1:]])}")
    print(f"{len(sentences)} sentences, {sum(map(len, sentences))} tokens, one batch\n")
    print("| model | precision | calibration | layer 0 | layer 1 | layer 2 | the kernels' choice |")
    print("|---|---|---|--:|--:|--:|---|")
    with tempfile.TemporaryDirectory(prefix="bench-parity-") as tmp:
        for model in args.models:
            if model == "golden":
                files = (args.fixture / "options.json", args.fixture / "lm_weights.hdf5")
            else:
                files = random_model("original", tmp, seed=0)
            with torch.no_grad():
                want = ElmoBiLm(*files, backend="reference")(ids)
            for precision in args.precisions:
                for calibration in ("on", "off"):
                    errors, choice = run(files, ids, want, precision, calibration)
                    cells = " | ".join(f"{e:.2e}" for e in errors)
                    print(f"| {model} | {precision} | {calibration} | {cells} | `{choice}` |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
