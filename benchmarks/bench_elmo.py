#!/usr/bin/env python
"""``Elmo`` inside a model: inference, and a training step on top of a frozen or fine-tuned biLM.

    python benchmarks/bench_elmo.py                      # 'small' random model, batch 32
    python benchmarks/bench_elmo.py --preset original --batch 16 --repeats 3

Rows, fast backend vs reference backend in the same process, on the same sentences
(benchmarks/corpus.py, ~25 tokens each): Elmo with 2 representations and layer norm,
  * inference: eval() under torch.no_grad();
  * train, frozen biLM: train() with dropout, backward of a loss on both representations (only
    the scalar mixes get gradients: the biLM runs on the fast path);
  * train, fine-tuned biLM (requires_grad=True): the biLM's weights train too, so both backends run
    the reference stages under autograd: "reference" the oracle bilm_ref as it is, "fast" the same
    functions over each distinct token of the batch once (no fast op has a backward).
Median seconds of --repeats after one warm-up; tokens/s counts real tokens. Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_lstm import wait_quiet  # noqa: E402
from corpus import make_sentences  # noqa: E402

from elmo_fast import Elmo, batch_to_ids  # noqa: E402
from elmo_fast.formats.random_models import random_model  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small", "medium", "original"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to this many seconds for a quiet machine")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    sentences = make_sentences(args.batch, seed=1)
    ids = batch_to_ids(sentences)
    n_tokens = sum(map(len, sentences))
    with tempfile.TemporaryDirectory() as d:
        files = random_model(args.preset, d, seed=0)
        models = {
            backend: Elmo(*files, num_output_representations=2, do_layer_norm=True, dropout=0.1, backend=backend)
            for backend in ("fast", "reference")
        }
        tuned = {
            backend: Elmo(
                *files,
                num_output_representations=2,
                do_layer_norm=True,
                dropout=0.1,
                backend=backend,
                requires_grad=True,
            )
            for backend in ("fast", "reference")
        }

    def infer(m):
        def run():
            m.eval()
            with torch.no_grad():
                m(ids)

        return run

    def train(m):
        def run():
            m.train()
            m.zero_grad(set_to_none=True)
            out = m(ids)["elmo_representations"]
            (out[0].square().mean() + out[1].mean()).backward()

        return run

    rows = []
    for name, make in (("inference", infer), ("train, frozen biLM", train)):
        secs = {b: median_seconds(make(m), args.repeats) for b, m in models.items()}
        rows.append((name, secs["reference"], secs["fast"]))
    secs = {b: median_seconds(train(m), max(1, args.repeats // 2)) for b, m in tuned.items()}
    rows.append(("train, fine-tuned biLM", secs["reference"], secs["fast"]))

    print(
        f"# Elmo (2 representations, layer norm), preset {args.preset}, batch {args.batch} sentences "
        f"({n_tokens} tokens), {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    print("| | reference s | reference tok/s | fast s | fast tok/s | speedup |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, ref, fast in rows:
        print(
            f"| {name} | {ref:.3f} | {n_tokens / ref:,.0f} | {fast:.3f} | {n_tokens / fast:,.0f} | {ref / fast:.1f}x |"
        )


if __name__ == "__main__":
    main()
