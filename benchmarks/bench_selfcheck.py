"""What the first-use self-check (ELMO_FAST_SELFCHECK, elmo_fast.verification.first_use) costs.

    python benchmarks/bench_selfcheck.py [--device cpu] [--repeats 5]

* first use: each op's checks on the device (what its first call in a process pays once: check_op),
  the median of --repeats fresh runs, per op and in all;
* a model's first forward: a random `small` (--preset) biLM's forward (fp32, then bf16) in mode all, each op
  checked in the schedule the model runs it in (the calibration's tuning, packed weights), against the
  same forward with the check off (both after a warm-up forward), the median of --repeats;
* every later call: an op call with the hook installed but nothing to check (a CPU op in the default
  mode, cuda; a checked op in mode all) against the hook off, on the smallest input (highway_gate on
  [2, 2]), the median of many calls, so that the hook's own cost shows.
Prints the CPU (lscpu's model name), torch's threads and the load with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_name  # noqa: E402

from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.verification import first_use, selfcheck  # noqa: E402
from elmo_fast.verification.selfcheck_cases import OPS, Schedule  # noqa: E402


def per_call_us(fn, calls: int = 20000) -> float:
    for _ in range(200):
        fn()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--preset", default="small", help="the random model of the first-forward rows")
    args = parser.parse_args()
    ops.require_extension()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"bench_selfcheck: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {load:.1f}, device {args.device}"
    )

    rows = []
    for name in OPS:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            results = selfcheck.check_op(name, args.device)
            times.append(time.perf_counter() - start)
            assert not any(r.failed for r in results), [r.one_line() for r in results if r.failed]
        rows.append((name, statistics.median(times) * 1e3, len(results)))
    print(f"\nfirst use (each op's checks on {args.device}, median of {args.repeats}):")
    print(f"  {'op':14s} {'ms':>8s} {'checks':>7s}")
    for name, ms, n in rows:
        print(f"  {name:14s} {ms:8.1f} {n:7d}")
    print(f"  {'all ops':14s} {sum(ms for _, ms, _ in rows):8.1f}")

    import tempfile

    from elmo_fast import ElmoBiLm, batch_to_ids
    from elmo_fast.formats.random_models import random_model

    sentences = [["The", "cat", "sat", "on", "the", "mat", "."], ["A", "longer", "sentence", "with", "more", "words"]]
    ids = batch_to_ids(sentences * 4)
    print(f"\na model's first forward (random {args.preset!r}, {ids.shape[0]} sentences; median of {args.repeats}):")
    with tempfile.TemporaryDirectory() as tmp:
        files = random_model(args.preset, tmp, seed=0)
        for precision in ("fp32", "bf16"):
            bilm = ElmoBiLm(*files, precision=precision)
            first_use.enable(None)
            with torch.no_grad():
                bilm(ids)  # warm-up (and the calibration, measured or read once)
            checked, plain = [], []
            for _ in range(args.repeats):
                first_use.forget_checked()
                first_use.enable("all")
                start = time.perf_counter()
                with torch.no_grad():
                    bilm(ids)
                checked.append(time.perf_counter() - start)
                first_use.enable(None)
                start = time.perf_counter()
                with torch.no_grad():
                    bilm(ids)
                plain.append(time.perf_counter() - start)
            keys = sorted(
                {f"{op} ({'default' if s is None else Schedule.of_call(s).text()})" for op, _, s in first_use._passed}
            )
            first_use.forget_checked()
            c, p = statistics.median(checked) * 1e3, statistics.median(plain) * 1e3
            print(f"  {precision}: {c:.0f} ms checked vs {p:.0f} ms (+{c - p:.0f} ms); ops checked: {', '.join(keys)}")

    projected, x = torch.randn(2, 4), torch.randn(2, 2)
    call = lambda: ops.highway_gate(projected, x)  # noqa: E731
    first_use.enable(None)
    off = per_call_us(call)
    first_use.enable("cuda")
    cuda_mode = per_call_us(call)
    first_use.forget_checked()
    first_use.enable("all")
    call()  # checked once
    all_mode = per_call_us(call)
    first_use.enable(None)
    print(
        f"\nevery later call (highway_gate on [2, 2], µs per call): hook off {off:.2f}; default mode (cuda), a CPU op "
        f"{cuda_mode:.2f} (+{cuda_mode - off:.2f}); mode all, a checked op {all_mode:.2f} (+{all_mode - off:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
