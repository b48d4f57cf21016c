"""Corpus-scale `elmo-fast embed`: peak memory, wall time and tokens/s as the corpus grows.

Makes synthetic corpora (benchmarks/corpus.py), a random model of the `small` shapes
(`elmo-fast random-model small DIR`), and runs `elmo-fast embed` on each corpus in a fresh
subprocess, as a user would. Peak RSS is the child's own high-water mark (ru_maxrss from wait4, so
each run is measured alone); RSS is also sampled from /proc while it runs, to show whether it
grows with the corpus or stays flat. Also measures what ``sentence_to_index`` (the one structure
that needs every sentence, built at the end) costs at the largest size.

    python benchmarks/bench_stream.py --sentences 10000 200000 --mean-tokens 10 --format top
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import make_sentences  # noqa: E402


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def busy_share(seconds: float = 1.0) -> float:
    """Share of the machine's CPU time used (by anyone) over `seconds`, from /proc/stat."""

    def snap():
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return sum(vals), vals[3] + vals[4]

    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def write_corpus(path: Path, n: int, mean_tokens: float, seed: int) -> int:
    tokens = 0
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, 10_000):  # in chunks: the generator holds its sentences in memory
            chunk = make_sentences(min(10_000, n - start), seed=seed + start, mean_tokens=mean_tokens)
            tokens += sum(len(s) for s in chunk)
            f.write("".join(" ".join(s) + "\n" for s in chunk))
    return tokens


def run_embed(corpus: Path, out: Path, options: Path, weights: Path, fmt: str, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "elmo_fast",
        "embed",
        str(corpus),
        str(out),
        f"--{fmt}",
        "--options",
        str(options),
        "--weights",
        str(weights),
        "--overwrite",
        *extra,
    ]
    err_path = out.with_suffix(".stderr")
    start = time.perf_counter()
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        samples = []
        while True:
            # wait4 gives this child's own rusage: its peak RSS, not the largest of all children
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            rss = rss_mb(proc.pid)
            if rss is not None:
                samples.append((time.perf_counter() - start, rss))
            time.sleep(0.5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    text = err_path.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text[-2000:]}")
    # the closing lines: "N sentences, M tokens -> OUT (size) in W s (S s to start, E s to embed and write)",
    # then the steady rate after the first batch (absent with a single batch)
    m = re.search(
        r"elmo-fast: ([\d,]+) sentences, ([\d,]+) tokens.* \(([\d.]+) s to start, ([\d.]+) s to embed "
        r"and write\)",
        text,
    )
    steady = re.search(r"elmo-fast: ([\d,]+) tokens/s steady", text)
    tokens, embed_s = int(m.group(2).replace(",", "")), float(m.group(4))
    return {
        "wall_s": wall,
        "embed_s": embed_s,
        "tokens": tokens,
        "tokens_per_s": int(tokens / embed_s),
        "steady_tokens_per_s": int(steady.group(1).replace(",", "")) if steady else None,
        "startup_s": float(m.group(3)),
        "samples": samples,
        "output_mb": out.stat().st_size / 2**20,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def sentence_map_cost(corpus: Path) -> dict:
    """Memory and time of building sentence_to_index's JSON from the spill, as embed_file does at the end."""
    from elmo_fast.embedding.layout import sentence_map

    pairs = [(line.strip(), str(i)) for i, line in enumerate(open(corpus, encoding="utf-8"))]
    tracemalloc.start()
    start = time.perf_counter()
    text = sentence_map(pairs)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"sentences": len(pairs), "json_mb": len(text) / 2**20, "peak_mb": peak / 2**20, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, nargs="+", default=[10_000, 200_000])
    ap.add_argument("--mean-tokens", type=float, default=10.0)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--format", default="top", choices=["all", "top", "average"])
    ap.add_argument("--extra", default="", help="more `elmo-fast embed` arguments, e.g. '--resume'")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import torch

    tmp = tempfile.TemporaryDirectory() if args.dir is None else None
    work = Path(args.dir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    subprocess.run(
        [sys.executable, "-m", "elmo_fast", "random-model", args.preset, str(model), "--overwrite"],
        check=True,
        capture_output=True,
    )
    options, weights = model / "options.json", model / "weights.hdf5"
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
        f"Python {platform.python_version()}; preset {args.preset}, --{args.format}, mean {args.mean_tokens} "
        f"tokens/sentence {args.extra}"
    )
    print(
        "| sentences | tokens | wall s | embed s | tokens/s | peak RSS MB | RSS at 10% / 50% / 90% of the run MB "
        "| output MB | machine busy before |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    results = []
    for n in args.sentences:
        corpus = work / f"corpus_{n}.txt"
        write_corpus(corpus, n, args.mean_tokens, seed=n)
        busy = busy_share()
        r = run_embed(corpus, work / f"out_{n}.h5", options, weights, args.format, args.extra.split())
        samples = r.pop("samples")
        pick = [
            min(samples, key=lambda s: abs(s[0] - q * r["wall_s"]))[1] if samples else float("nan")
            for q in (0.1, 0.5, 0.9)
        ]
        r.update(sentences=n, rss_10_50_90=pick, busy_before=busy)
        results.append(r)
        peak = f"{r['peak_rss_mb']:.0f}"
        print(
            f"| {n:,} | {r['tokens']:,} | {r['wall_s']:.1f} | {r['embed_s']:.1f} | {r['tokens_per_s']:,} | {peak} | "
            f"{' / '.join(f'{x:.0f}' for x in pick)} | {r['output_mb']:.0f} | {busy:.0%} |",
            flush=True,
        )
        (work / f"out_{n}.h5").unlink()
    cost = sentence_map_cost(work / f"corpus_{max(args.sentences)}.txt")
    print(
        f"\nsentence_to_index for {cost['sentences']:,} sentences: JSON {cost['json_mb']:.1f} MB, built in "
        f"{cost['seconds']:.2f} s with {cost['peak_mb']:.1f} MB at peak (tracemalloc; the list of pairs read "
        f"back from the spill file not counted)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "sentence_map": cost}, indent=1))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
