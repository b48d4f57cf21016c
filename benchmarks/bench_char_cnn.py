"""CPU benchmark: the fused char_cnn op against char_cnn_ref, tokens/s at 1 and 2 threads.

    python benchmarks/bench_char_cnn.py [--tokens 2000] [--repeats 21] [--threads 1,2]

The char CNN of the small and original presets (the same filters, D = 16) with random weights, on
--tokens tokens of three kinds:
  5-8 bytes   English words of 5..8 UTF-8 bytes, from the bilm-tf fixture's sentences
              (../shared/fixtures/bilm_tf_tiny/sentences.json), in text order, cycled
  fixture     all of the fixture's tokens (punctuation included), in text order, cycled
  corpus      benchmarks/corpus.py's Zipf-distributed English sentences, flattened
Every call's inputs are the same [N, 50] ids (repeats included: the model would deduplicate
first). Median wall time of --repeats calls after a warm-up; the reference gets fewer repeats
(it is slow). Prints the machine and versions, then the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from corpus import make_sentences  # noqa: E402

from elmo_fast import batch_to_ids
from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.bilm.reference import char_cnn_ref  # noqa: E402
from elmo_fast.formats.random_models import PRESETS  # noqa: E402

SENTENCES = ROOT.parent / "shared" / "fixtures" / "bilm_tf_tiny" / "sentences.json"


def token_sets(n: int) -> dict[str, list[str]]:
    text = [t for group in json.loads(SENTENCES.read_text()) for s in group for t in s.split()]
    words = [t for t in text if 5 <= len(t.encode("utf-8")) <= 8]
    corpus = [t for s in make_sentences(n // 10 + 10, seed=0) for t in s]
    return {
        "5-8 bytes": [words[i % len(words)] for i in range(n)],
        "fixture": [text[i % len(text)] for i in range(n)],
        "corpus": corpus[:n],
    }


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-touch allocations, thread pool start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()

    o = PRESETS["small"]
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(262, o.char_dim, generator=gen)
    emb[0] = 0
    ws = [torch.randn(n, o.char_dim, w, generator=gen) / (w * o.char_dim) ** 0.5 for w, n in o.filters]
    bs = [0.1 * torch.randn(n, generator=gen) for _, n in o.filters]

    cap = os.environ.get("ELMO_FAST_CPU_ISA")
    print(
        f"{cpu_name()}, {torch.get_num_threads()} threads, Python {platform.python_version()}, "
        f"torch {torch.__version__}; filters {list(o.filters)}, D={o.char_dim}, N={args.tokens}"
        + (f", ELMO_FAST_CPU_ISA={cap}" if cap else "")
    )
    print(f"{'tokens':>10} {'bytes':>5} {'distinct':>8} {'thr':>3} {'op tok/s':>11} {'ref tok/s':>9} {'speedup':>8}")
    threads = torch.get_num_threads()
    for name, tokens in token_sets(args.tokens).items():
        ids = batch_to_ids([tokens])[0]
        mean_bytes = sum(len(t.encode("utf-8")) for t in tokens) / len(tokens)
        out = ops.char_cnn(ids, emb, ws, bs)
        expected = char_cnn_ref(ids, emb.double(), [w.double() for w in ws], [b.double() for b in bs])
        err = (out.double() - expected).abs().max().item()
        assert err <= 1e-5, f"{name}: max abs error {err:.2e}"
        for t in (int(x) for x in args.threads.split(",")):
            torch.set_num_threads(t)
            op_s = median_seconds(lambda: ops.char_cnn(ids, emb, ws, bs), args.repeats)
            ref_s = median_seconds(lambda: char_cnn_ref(ids, emb, ws, bs), max(3, args.repeats // 4))
            print(
                f"{name:>10} {mean_bytes:5.2f} {len(set(tokens)):8d} {t:3d} {len(tokens) / op_s:11,.0f} "
                f"{len(tokens) / ref_s:9,.0f} {ref_s / op_s:7.0f}x"
            )
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
