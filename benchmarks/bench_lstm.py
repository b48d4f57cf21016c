#!/usr/bin/env python
"""Benchmark of the fused biLSTM op (``elmo_fast.bilm.ops.bilstm``) against ``bilstm_ref``, one process.

    python benchmarks/bench_lstm.py                        # 'original' shapes, B = 64 and 1, T = 27
    python benchmarks/bench_lstm.py --preset small --batch 16 --time 30
    python benchmarks/bench_lstm.py --modes                # also both thread schedules of the op
    python benchmarks/bench_lstm.py --gemms                # also the op's GEMM shapes standalone

Random weights (the recurrence kept contractive, as elmo_fast.formats.random_models does), all rows full length
unless --ragged. Each timing is the median of --repeats after --warmup calls. FLOPs count only
the GEMMs (multiply-add = 2): per step, direction and layer 2*n*P*4C (recurrent) + 2*n*C*P
(projection), plus 2*N*P*4C per direction for the input gates of layers >= 1 (N = sum of lengths).
"busy" is the share of the machine's CPU time that other processes used during a row: rows with
more than 5% were disturbed and should be rerun. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.bilm.reference import bilstm_ref  # noqa: E402

PRESETS = {"tiny": (16, 64), "small": (128, 1024), "medium": (256, 2048), "original": (512, 4096)}


def cpu_ticks() -> tuple[int, float]:
    """(busy ticks of the whole machine, this process's CPU seconds)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return busy, usage.ru_utime + usage.ru_stime


def wait_quiet(max_wait: float, share: float = 0.1) -> float:
    """Wait (up to max_wait s) until other processes use < share of the CPUs over 2 s; returns their share."""
    deadline = time.monotonic() + max_wait
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    while True:
        busy0, own0 = cpu_ticks()
        time.sleep(2.0)
        busy1, own1 = cpu_ticks()
        others = max(0.0, ((busy1 - busy0) / ticks_per_s - (own1 - own0)) / (2.0 * os.cpu_count()))
        if others < share or time.monotonic() > deadline:
            return others
        time.sleep(5.0)


def timed(fn, warmup: int, repeats: int) -> tuple[float, float]:
    """(median seconds per call, share of all CPUs used by other processes meanwhile)."""
    for _ in range(warmup):
        fn()
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    busy0, own0 = cpu_ticks()
    wall0 = time.perf_counter()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    wall = time.perf_counter() - wall0
    busy1, own1 = cpu_ticks()
    others = (busy1 - busy0) / ticks_per_s - (own1 - own0)
    return statistics.median(times), max(0.0, others / (wall * os.cpu_count()))


def make_inputs(P: int, C: int, L: int, B: int, T: int, ragged: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    weights = []
    for _ in range(L):
        for _ in range(2):
            weights += [
                randn(4 * C, P, std=P**-0.5),
                randn(4 * C, P, std=0.35 * P**-0.5),
                randn(4 * C, std=0.1),
                randn(P, C, std=1.5 * C**-0.5),
            ]
    U = B * T
    xg0 = randn(U, 2, 4 * C, std=1.0)
    token_index = torch.arange(U).view(B, T)
    if ragged:
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        lengths[0] = T
    else:
        lengths = torch.full((B,), T)
    return xg0, token_index, lengths, weights


def gemm_flops(P: int, C: int, L: int, lengths: torch.Tensor) -> dict[str, float]:
    T = int(lengths.max()) if lengths.numel() else 0
    active = [(lengths > s).sum().item() for s in range(T)]
    N = sum(active)
    return {
        "recurrent": 2 * L * sum(2 * n * P * 4 * C for n in active),
        "projection": 2 * L * sum(2 * n * C * P for n in active),
        "input": 2 * (L - 1) * 2 * N * P * 4 * C,
    }


def standalone_gemms(P: int, C: int, B: int, T: int, warmup: int, repeats: int) -> list[str]:
    """The op's GEMM shapes through torch.mm, at the current thread count and at 1 thread."""
    lines = []
    threads = torch.get_num_threads()
    shapes = [("recurrent", B, P, 4 * C), ("projection", B, C, P), ("input", B * T, P, 4 * C)]
    for nt in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(nt)
        for name, m, k, n in shapes:
            a, w, out = torch.randn(m, k), torch.randn(n, k), torch.empty(m, n)
            t, busy = timed(lambda: torch.mm(a, w.t(), out=out), warmup, repeats)
            lines.append(
                f"  {name:10s} [{m} x {k}] @ [{k} x {n}]  {nt} thread(s): {t * 1e3:8.3f} ms "
                f"{2 * m * k * n / t / 1e9:6.1f} GFLOP/s  busy {busy:.0%}"
            )
    torch.set_num_threads(threads)
    return lines


def breakdown(fn) -> str:
    """Share of one call spent in ATen GEMMs (aten::mm / addmm, BLAS or oneDNN) vs the rest (the op's
    own kernels: pointwise passes, gemv_nt, copies), with the directions in turn so that every
    GEMM runs on the profiled thread."""
    from torch.profiler import ProfilerActivity, profile

    os.environ["ELMO_FAST_BILSTM_THREADS"] = "sequential"
    try:
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            fn()
            total = time.perf_counter() - start
    finally:
        os.environ.pop("ELMO_FAST_BILSTM_THREADS", None)
    per_op = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    gemm = sum(per_op.get(k, 0.0) for k in ("aten::mm", "aten::addmm"))
    copies = sum(per_op.get(k, 0.0) for k in ("aten::copy_", "aten::add"))
    return (
        f"  breakdown (directions in turn): {total * 1e3:.1f} ms, ATen GEMMs {gemm * 1e3:.1f} ms "
        f"({gemm / total:.0%}), ATen copies/adds {copies * 1e3:.1f} ms, rest {(total - gemm - copies) * 1e3:.1f} ms "
        f"({(total - gemm - copies) / total:.0%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="original", choices=PRESETS)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", default="64,1", help="comma-separated batch sizes")
    ap.add_argument("--time", type=int, default=27)
    ap.add_argument("--ragged", action="store_true", help="random lengths in [1, T] (row 0 full)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--weights",
        default="fp32",
        choices=["fp32", "bf16"],
        help="dtype of the GEMM weights (states and outputs stay fp32)",
    )
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--modes", action="store_true", help="time both thread schedules of the op")
    ap.add_argument("--gemms", action="store_true", help="time the op's GEMM shapes standalone")
    ap.add_argument("--breakdown", action="store_true", help="profile where one call's time goes")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each row, wait up to S seconds for the other processes to go quiet",
    )
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    ops.require_extension()
    P, C = PRESETS[args.preset]
    L, T = args.layers, args.time
    knobs = {k: v for k, v in os.environ.items() if k.startswith("ELMO_FAST_")}
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, MKL {torch.backends.mkl.is_available()}; "
        f"preset {args.preset} P={P} C={C} L={L} T={T} {'ragged' if args.ragged else 'full'} lengths, "
        f"{args.weights} weights {knobs or ''}"
    )
    modes = ["directions", "sequential"] if args.modes else [None]
    with torch.inference_mode():
        for B in [int(b) for b in args.batch.split(",")]:
            xg0, index, lengths, weights = make_inputs(P, C, L, B, T, args.ragged)
            if args.weights == "bf16":
                weights = [w.bfloat16() if k % 4 != 2 else w for k, w in enumerate(weights)]
            fl = gemm_flops(P, C, L, lengths)
            total = sum(fl.values())
            print(
                f"B={B}: GEMM GFLOP per call {total / 1e9:.2f} (recurrent {fl['recurrent'] / 1e9:.2f}, "
                f"projection {fl['projection'] / 1e9:.2f}, input {fl['input'] / 1e9:.2f})"
            )
            rows = []
            for mode in modes:
                if mode is not None:
                    os.environ["ELMO_FAST_BILSTM_THREADS"] = mode
                if args.wait_quiet:
                    wait_quiet(args.wait_quiet)
                t, busy = timed(lambda: ops.bilstm(xg0, index, lengths, weights, 3.0, 3.0), args.warmup, args.repeats)
                rows.append((f"bilstm{'' if mode is None else ' [' + mode + ']'}", t, busy))
            os.environ.pop("ELMO_FAST_BILSTM_THREADS", None)
            if not args.no_reference:
                if args.wait_quiet:
                    wait_quiet(args.wait_quiet)
                ref_weights = [w.float() for w in weights]
                t, busy = timed(
                    lambda: bilstm_ref(xg0, index, lengths, ref_weights, 3.0, 3.0), 1, max(1, args.repeats // 2)
                )
                rows.append(("bilstm_ref", t, busy))
            for name, t, busy in rows:
                print(f"  {name:24s} {t * 1e3:9.2f} ms  {total / t / 1e9:6.1f} GFLOP/s  busy {busy:.0%}")
            if args.breakdown:
                if args.wait_quiet:
                    wait_quiet(args.wait_quiet)
                print(breakdown(lambda: ops.bilstm(xg0, index, lengths, weights, 3.0, 3.0)))
            if args.gemms:
                print("\n".join(standalone_gemms(P, C, B, T, args.warmup, args.repeats)))


if __name__ == "__main__":
    main()
