"""The host's share of a GPU forward planned on the CPU: the batch's distinct tokens.

    python benchmarks/bench_host_plan.py

A biLM on a GPU given its char ids on the CPU finds the distinct tokens on the host
(elmo_fast.bilm.distinct_rows.distinct_rows) rather than with torch.unique(dim=0), which on the GPU waits
for it and on the CPU sorts whole rows. Both on the CPU, one thread, median of 7, over realistic
sentences (benchmarks/corpus.py) with their boundaries.
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import make_sentences  # noqa: E402

from elmo_fast import batch_to_ids  # noqa: E402
from elmo_fast.bilm.distinct_rows import distinct_rows  # noqa: E402
from elmo_fast.bilm.reference import add_sentence_boundaries  # noqa: E402


def median_ms(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def main() -> int:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread")
    print("| batch | positions (tokens) | torch.unique(dim=0) | distinct_rows |")
    print("|---|---|--:|--:|")
    for batch in (1, 64, 256):
        ids, mask = add_sentence_boundaries(batch_to_ids(make_sentences(batch, seed=1)))
        B, T, W = ids.shape
        unique = median_ms(lambda: torch.unique(ids.reshape(B * T, W), dim=0, return_inverse=True))
        rows = median_ms(lambda: distinct_rows(ids, mask))
        print(f"| {batch} | {B * T:,} ({int(mask.sum()):,}) | {unique:.2f} ms | {rows:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
