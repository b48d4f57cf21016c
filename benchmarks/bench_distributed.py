"""`elmo-fast embed` split among ranks with torchrun, against one process, on this machine.

Writes a synthetic corpus (benchmarks/corpus.py) and a random model of the `small` shapes, then
runs, each in fresh processes as a user would:

* one process, all cores (torch's default threads): the plain way (one HDF5 file written as it
  goes), and ``--resume`` (shards in OUTPUT.partial/, then the output assembled from them: what
  every torchrun run does);
* ``torchrun --standalone --nproc-per-node R`` for each R asked (cores split among the ranks).

From each run's closing lines: the wall time, the time to start (interpreter, torch, model), to
embed and write, of it to assemble, and the steady tokens/s (after the first batch; summed over
ranks). Also measured alone: how fast one rank reads and splits the whole input (every rank does),
and how fast the assembly copies (output bytes / assembly seconds).

    python benchmarks/bench_distributed.py --sentences 4000 --window 500 --ranks 2
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from corpus import make_sentences  # noqa: E402

FIRST = re.compile(
    r"elmo-fast: ([\d,]+) sentences, ([\d,]+) tokens.* -> .* \(([\d.]+) (kB|MB|GB)\) in ([\d.]+) s "
    r"\(([\d.]+) s to start, ([\d.]+) s to embed and write(?:, ([\d.]+) s of it assembling the output)?\)"
)
RATE = re.compile(r"elmo-fast: ([\d,]+) tokens/s steady")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    return sum(vals), vals[3] + vals[4]  # all, idle + iowait


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


def wait_quiet(limit_s: float, below: float = 0.15) -> float:
    """Wait (at most limit_s) until other work uses under `below` of the machine; returns the last share."""
    deadline = time.monotonic() + limit_s
    share = busy_share()
    while share >= below and time.monotonic() < deadline:
        share = busy_share(2.0)
    return share


def parse(stderr: str) -> dict:
    m = FIRST.search(stderr)
    if not m:
        raise SystemExit(f"no closing line in:\n{stderr[-3000:]}")
    scale = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[m[4]]
    rate = RATE.search(stderr)
    return {
        "sentences": int(m[1].replace(",", "")),
        "tokens": int(m[2].replace(",", "")),
        "output_mb": float(m[3]) * scale,
        "wall": float(m[5]),
        "start": float(m[6]),
        "embed": float(m[7]),
        "assembly": float(m[8]) if m[8] else 0.0,
        "steady": int(rate[1].replace(",", "")) if rate else None,
    }


def run(label: str, cmd: list[str], env: dict, repeats: int, quiet_s: float) -> dict:
    """The best (highest steady rate) of `repeats` runs, each after waiting for a quiet machine, each
    from scratch (a --resume run would find its finished output and do nothing)."""
    best = None
    output = Path(cmd[cmd.index("embed") + 2])
    for _ in range(repeats):
        output.unlink(missing_ok=True)
        busy = wait_quiet(quiet_s)
        all0, idle0 = _cpu_jiffies()
        ours0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        all1, idle1 = _cpu_jiffies()
        ours1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(f"{label} failed:\n{r.stderr[-3000:]}")
        # the machine's CPU time during the run, less our own processes' (torchrun and its ranks
        # included: they are waited-for children): what other work took from the run
        ticks = os.sysconf("SC_CLK_TCK")
        used = ((all1 - idle1) - (all0 - idle0)) / ticks
        ours = (ours1.ru_utime + ours1.ru_stime) - (ours0.ru_utime + ours0.ru_stime)
        others = max(0.0, used - ours) / max((all1 - all0) / ticks, 1e-9)
        out = {**parse(r.stderr), "label": label, "busy": busy, "others": others}
        if best is None or (out["steady"] or 0) > (best["steady"] or 0):
            best = out
    return best


def reading_rate(path: Path, copies: int = 20) -> float:
    """Tokens/s of what every rank does to the whole input, its own windows or not: read, decode,
    strip and split each line, cut windows (the corpus repeated `copies` times; best of 3)."""
    sys.path.insert(0, str(REPO))
    from itertools import islice

    from elmo_fast.embedding.lines import read_sentences

    big = path.with_suffix(f".x{copies}.txt")
    big.write_text(path.read_text(encoding="utf-8") * copies, encoding="utf-8")
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        tokens = 0
        lines = read_sentences(str(big))
        while window := list(islice(lines, 2048)):
            tokens += sum(len(line.tokens) for line in window)
        best = max(best, tokens / (time.perf_counter() - start))
    big.unlink()
    return best


def prepare_run(args, prefix: str, **extra_env: str) -> tuple[Path, dict, Path, Path]:
    """The run's folder (``args.dir`` or a new temporary one), the children's environment (this checkout
    on PYTHONPATH, no torchrun variables or thread count inherited), the corpus (``args.sentences``
    sentences of ``benchmarks/corpus.py``, seed 7) and a random ``args.preset`` model written there."""
    tmp = Path(args.dir or tempfile.mkdtemp(prefix=prefix))
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **extra_env,
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS"):
        env.pop(name, None)
    corpus = tmp / "corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(
            "".join(" ".join(s) + "\n" for s in make_sentences(args.sentences, seed=7, mean_tokens=args.mean_tokens))
        )
    model = tmp / "model"
    subprocess.run(
        [sys.executable, "-m", "elmo_fast", "random-model", args.preset, str(model), "--overwrite"],
        check=True,
        env=env,
        capture_output=True,
    )
    return tmp, env, corpus, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=3000)
    ap.add_argument("--mean-tokens", type=float, default=20.0)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--format", default="all", choices=["all", "top", "average"])
    ap.add_argument(
        "--window",
        type=int,
        default=500,
        help="sentences per window, in every run (shares are dealt by windows: a few per rank at least)",
    )
    ap.add_argument("--dir", help="work here instead of a temporary directory")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration; the best is shown")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        metavar="S",
        help="before each run, wait up to S seconds for other work to use under 15%% of the machine",
    )
    args = ap.parse_args()

    import torch

    tmp, env, corpus, model = prepare_run(args, "bench-distributed-")
    common = [
        f"--{args.format}",
        "--options",
        str(model / "options.json"),
        "--weights",
        str(model / "weights.hdf5"),
        "--overwrite",
        "--file-friendly-logging",
        "--window",
        str(args.window),
    ]
    embed = [sys.executable, "-m", "elmo_fast", "embed", str(corpus)]
    rep = (args.repeats, args.wait_quiet)
    rows = [
        run(
            f"1 process, {torch.get_num_threads()} threads, plain", [*embed, str(tmp / "plain.h5"), *common], env, *rep
        ),
        run(
            f"1 process, {torch.get_num_threads()} threads, --resume",
            [*embed, str(tmp / "resume.h5"), *common, "--resume"],
            env,
            *rep,
        ),
    ]
    for ranks in args.ranks:
        threads = max(1, len(os.sched_getaffinity(0)) // ranks)
        rows.append(
            run(
                f"torchrun, {ranks} ranks x {threads} thread{'s' if threads > 1 else ''}",
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    str(ranks),
                    "-m",
                    "elmo_fast",
                    "embed",
                    str(corpus),
                    str(tmp / f"ranks{ranks}.h5"),
                    *common,
                ],
                env,
                *rep,
            )
        )
    read_rate = reading_rate(corpus)
    tokens = rows[0]["tokens"]

    print(
        f"- machine: {cpu_name()}, {len(os.sched_getaffinity(0))} cores; torch {torch.__version__}; "
        f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(
        f"- corpus: {rows[0]['sentences']:,} sentences, {tokens:,} tokens (benchmarks/corpus.py, mean "
        f"{args.mean_tokens:g} tokens); model: random `{args.preset}`; --{args.format}; output "
        f"{rows[0]['output_mb']:.1f} MB"
    )
    print(
        f"- command: `python benchmarks/bench_distributed.py --sentences {args.sentences} --window {args.window} "
        f"--ranks {' '.join(map(str, args.ranks))} --repeats {args.repeats}`; every run with --window "
        f"{args.window}; the best of {args.repeats} runs each"
    )
    print()
    print(
        "| run | steady tokens/s | tokens/s, embed and write | wall s | start s | embed and write s | "
        "of it assembling s | assembly MB/s | other work during the run |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        steady = f"{r['steady']:,}" if r["steady"] is not None else "-"
        copy = f"{r['output_mb'] / r['assembly']:,.0f}" if r["assembly"] else "-"
        print(
            f"| {r['label']} | {steady} | {r['tokens'] / r['embed']:,.0f} | {r['wall']:.2f} | {r['start']:.2f} | "
            f"{r['embed']:.2f} | {r['assembly']:.2f} | {copy} | {r['others']:.0%} |"
        )
    print()
    print(
        f"Reading the input as every rank does (read, decode, strip and split lines, cut windows; the corpus "
        f"20 times over, best of 3): {read_rate:,.0f} tokens/s in one process."
    )


if __name__ == "__main__":
    main()
