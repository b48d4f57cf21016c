#!/usr/bin/env python
"""Where an LSTM step's time goes: one-layer ``bilstm`` steps against the same GEMMs alone, per weight layout.

    python benchmarks/bench_lstm_step.py                    # 'original' shapes, 1, 16 and 64 rows
    python benchmarks/bench_lstm_step.py --preset small --rows 1,64

For each row count n and layout (fp32 weights through BLAS, fp32 and bf16 weights packed for oneDNN's
BRGeMM kernel, ``ops.pack_weight``): the time of one direction-step of the op (one layer, --steps
steps, both directions in turn on all threads: the call's time over 2 x steps) and the time of the
same GEMMs through ``ops.linear`` (recurrent [n, P] x [P, 4C] and projection [n, C] x [C, P], both
directions, over 2). "the rest" is what the step spends outside its GEMMs: the fused pointwise
passes (gates, cell, clips, bf16 rounding of the next GEMM's inputs) and the op's own overheads.
Medians of --repeats after one warm-up call; random weights; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench_lstm import PRESETS  # noqa: E402

from elmo_fast.bilm import ops  # noqa: E402


def median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="original", choices=sorted(PRESETS))
    ap.add_argument("--rows", default="1,16,64", help="comma-separated row counts")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    P, C = PRESETS[args.preset]
    gen = torch.Generator().manual_seed(0)
    w = []
    for _ in range(2):
        w += [
            torch.randn(4 * C, P, generator=gen) * P**-0.5,
            torch.randn(4 * C, P, generator=gen) * 0.3 * P**-0.5,
            torch.randn(4 * C, generator=gen) * 0.1,
            torch.randn(P, C, generator=gen) * C**-0.5,
        ]
    layouts = {"fp32 BLAS": w}
    for name, dtype in (("fp32 packed", torch.float32), ("bf16 packed", torch.bfloat16)):
        if ops.packed_gemm_available(dtype):  # bf16 needs AVX-512 with BF16, or AMX
            layouts[name] = [t if k % 4 in (0, 2) else ops.pack_weight(t.to(dtype)) for k, t in enumerate(w)]
    print(f"# {args.preset} (P = {P}, C = {C}), {args.threads} threads, torch {torch.__version__}")
    if len(layouts) < 3:
        print("# bf16 packed: left out, this CPU cannot run packed bfloat16 weights (AVX-512 with BF16, or AMX)")
    print("| rows | layout | step ms | its GEMMs alone ms | GEMM GFLOP/s | the rest |")
    print("|--:|---|--:|--:|--:|--:|")
    for n in (int(r) for r in args.rows.split(",")):
        xg0 = torch.randn(n, 2, 4 * C, generator=gen)
        index = torch.arange(n).unsqueeze(1).expand(n, args.steps).contiguous()
        lengths = torch.full((n,), args.steps)
        h, hc = torch.randn(n, P, generator=gen), torch.randn(n, C, generator=gen)
        for name, weights in layouts.items():
            step = median_s(
                lambda: ops.bilstm(xg0, index, lengths, weights, 3.0, 3.0, None, None, [0, 0, 0]), args.repeats
            ) / (2 * args.steps)
            gemms = (
                median_s(
                    lambda: (
                        [ops.linear(h, weights[4 * d + 1], None, 0) for d in range(2)]
                        + [ops.linear(hc, weights[4 * d + 3], None, 0) for d in range(2)]
                    ),
                    args.repeats,
                )
                / 2
            )
            flops = 2 * n * (P * 4 * C + C * P)
            print(
                f"| {n} | {name} | {step * 1e3:.3f} | {gemms * 1e3:.3f} | {flops / gemms / 1e9:.0f} "
                f"| {100 * (1 - gemms / step):.0f}% |",
                flush=True,
            )


if __name__ == "__main__":
    main()
