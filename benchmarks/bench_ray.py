"""Ray Data's ElmoBatchEmbedder against one `elmo-fast embed` process and torchrun, on this machine.

Writes a synthetic corpus (benchmarks/corpus.py) and a random model of the `small` shapes, then runs,
each a fresh command as a user would, on the same corpus and model, each token's layer average
([tokens, D]) as output:

* ``elmo-fast embed`` in one process (torch's default threads: every core), one HDF5 file;
* ``torchrun --standalone --nproc-per-node 2 -m elmo_fast embed`` (cores split among the ranks);
* Ray Data: ``ray.init(num_cpus=C)`` (C: the cores), ``read_text -> map_batches(ElmoBatchEmbedder,
  concurrency=2) -> write_parquet``, each actor with half a CPU of Ray's accounts (one torch thread:
  two actors on two cores; half, so that Ray's read and write tasks find a CPU beside them).

Each run's wall time is from its command's start to its end (interpreter, imports, model, reading,
embedding, writing). The embed runs report their own phases (the closing lines); the Ray run reports
``ray.init``, and the actors time each call (a subclass of ElmoBatchEmbedder, appending to a log), so
that Ray's own share shows: its start, the actors' start (process, imports, model) before their first
call, and what is neither embedding nor start (scheduling, moving blocks, reading, writing parquet).
"Other work during the run" is the machine's CPU time not spent by the run's processes, every one of
them counted, Ray's daemons and workers included (this process adopts the workers that outlive their
raylet and reaps them): the same measure of a disturbed run in every row.

    python benchmarks/bench_ray.py --sentences 4000 --repeats 2
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_distributed import _cpu_jiffies, cpu_name, parse, prepare_run, wait_quiet  # noqa: E402


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux's child subreaper): Ray's
    workers are the raylet's children and outlive it at ray.shutdown; adopted and reaped here, their
    CPU time counts as the run's (RUSAGE_CHILDREN) instead of other work's."""
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(limit_s: float = 30.0) -> None:
    """Wait for the orphans a command left (Ray's workers stopping after their raylet), at most limit_s."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _timed(cmd: list[str], env: dict, quiet_s: float) -> tuple[subprocess.CompletedProcess, float, float, float]:
    """Run a command after waiting for a quiet machine: its result, wall seconds, the share of the
    machine other work took meanwhile (the CPU time of every process of the command counted as its
    own: _adopt_orphans), and the share busy before it started."""
    busy = wait_quiet(quiet_s)
    all0, idle0 = _cpu_jiffies()
    ours0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    _reap_orphans()
    all1, idle1 = _cpu_jiffies()
    ours1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    ticks = os.sysconf("SC_CLK_TCK")
    used = ((all1 - idle1) - (all0 - idle0)) / ticks
    ours = (ours1.ru_utime + ours1.ru_stime) - (ours0.ru_utime + ours0.ru_stime)
    others = max(0.0, used - ours) / max((all1 - all0) / ticks, 1e-9)
    return r, wall, others, busy


def embed_run(label: str, cmd: list[str], env: dict, output: Path, repeats: int, quiet_s: float) -> dict:
    """The fastest of `repeats` runs of an `elmo-fast embed` command (by wall time)."""
    best = None
    for _ in range(repeats):
        output.unlink(missing_ok=True)
        r, wall, others, busy = _timed(cmd, env, quiet_s)
        got = parse(r.stderr)
        row = {
            "label": label,
            "wall": wall,
            "start": got["start"],
            "work": got["embed"],
            "tokens": got["tokens"],
            "sentences": got["sentences"],
            "steady": got["steady"],
            "others": others,
            "busy": busy,
        }
        if best is None or row["wall"] < best["wall"]:
            best = row
    return best


def ray_run(
    label: str,
    corpus: Path,
    model: Path,
    out: Path,
    actors: int,
    batch_size: int,
    env: dict,
    repeats: int,
    quiet_s: float,
) -> dict:
    best = None
    for _ in range(repeats):
        log = out.with_suffix(".calls.jsonl")
        log.unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)  # write_parquet adds files beside an earlier run's
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--ray-driver",
            json.dumps(
                {
                    "corpus": str(corpus),
                    "model": str(model),
                    "out": str(out),
                    "actors": actors,
                    "batch_size": batch_size,
                    "log": str(log),
                }
            ),
        ]
        r, wall, others, busy = _timed(cmd, env, quiet_s)
        report = json.loads(r.stdout.strip().splitlines()[-1])
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        by_actor: dict[int, list[dict]] = {}
        for c in calls:
            by_actor.setdefault(c["pid"], []).append(c)
        busy_s = [sum(c["end"] - c["start"] for c in cs) for cs in by_actor.values()]
        first = [min(c["start"] for c in cs) - report["pipeline_start"] for cs in by_actor.values()]
        tokens = sum(c["tokens"] for c in calls)
        row = {
            "label": label,
            "wall": wall,
            "start": report["start"],
            "work": report["pipeline"],
            "tokens": tokens,
            "sentences": sum(c["rows"] for c in calls),
            "steady": None,
            "others": others,
            "busy": busy,
            "actors_used": len(by_actor),
            "embed_busy": busy_s,
            "actor_start": first,
            "calls": len(calls),
            "ray_init": report["ray_init"],
            "shutdown": report["shutdown"],
        }
        # steady: the actors' embedding rate while they run calls, summed over actors
        row["steady"] = sum(sum(c["tokens"] for c in cs) / max(b, 1e-9) for cs, b in zip(by_actor.values(), busy_s))
        if best is None or row["wall"] < best["wall"]:
            best = row
    return best


def ray_driver(spec: dict) -> None:
    """One Ray Data run, as a user's script: prints a JSON line of its timings."""
    import numpy as np  # noqa: F401

    from elmo_fast.cli.common import process_start

    began = process_start()
    import ray

    from elmo_fast.ray import ElmoBatchEmbedder

    class TimedEmbedder(ElmoBatchEmbedder):
        """ElmoBatchEmbedder, logging each call's span and tokens (one JSON line per call)."""

        def __init__(self, log: str, **kwargs) -> None:
            super().__init__(**kwargs)
            self.log = log

        def __call__(self, batch):
            start = time.time()
            out = super().__call__(batch)
            end = time.time()
            tokens = sum(len(t.split()) for t in batch["text"])
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(
                    json.dumps(
                        {"pid": os.getpid(), "start": start, "end": end, "rows": len(batch["text"]), "tokens": tokens}
                    )
                    + "\n"
                )
            return out

    init0 = time.perf_counter()
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    init_s = time.perf_counter() - init0
    pipeline_start, t0 = time.time(), time.perf_counter()
    options = spec["model"]
    ds = ray.data.read_text(spec["corpus"], override_num_blocks=4 * spec["actors"])
    ds = ds.map_batches(
        TimedEmbedder,
        fn_constructor_kwargs=dict(
            log=spec["log"],
            options_file=os.path.join(options, "options.json"),
            weight_file=os.path.join(options, "weights.hdf5"),
            output="average",
        ),
        concurrency=spec["actors"],
        num_cpus=0.5,
        batch_size=spec["batch_size"],
    )
    ds.write_parquet(spec["out"])
    pipeline = time.perf_counter() - t0
    t1 = time.perf_counter()
    ray.shutdown()
    print(
        json.dumps(
            {
                "start": t0 - began,
                "ray_init": init_s,
                "pipeline": pipeline,
                "pipeline_start": pipeline_start,
                "shutdown": time.perf_counter() - t1,
            }
        )
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--ray-driver":
        ray_driver(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sentences", type=int, default=4000)
    ap.add_argument("--mean-tokens", type=float, default=20.0)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--window", type=int, default=500, help="embed's --window (torchrun deals windows to ranks)")
    ap.add_argument("--ray-batch-size", type=int, default=500, help="rows per map_batches call")
    ap.add_argument("--runs", default="embed,torchrun,ray", help="which runs, comma-separated")
    ap.add_argument("--dir", help="work here instead of a temporary directory")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration; the fastest is shown")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        metavar="S",
        help="before each run, wait up to S seconds for other work to use under 15%% of the machine",
    )
    args = ap.parse_args()
    _adopt_orphans()

    import torch

    cores = len(os.sched_getaffinity(0))
    tmp, env, corpus, model = prepare_run(args, "bench-ray-", RAY_USAGE_STATS_ENABLED="0")
    common = [
        "--average",
        "--options",
        str(model / "options.json"),
        "--weights",
        str(model / "weights.hdf5"),
        "--overwrite",
        "--file-friendly-logging",
        "--window",
        str(args.window),
    ]
    runs = args.runs.split(",")
    rep = (args.repeats, args.wait_quiet)
    rows = []
    if "embed" in runs:
        rows.append(
            embed_run(
                f"`elmo-fast embed`, 1 process x {torch.get_num_threads()} threads",
                [sys.executable, "-m", "elmo_fast", "embed", str(corpus), str(tmp / "one.h5"), *common],
                env,
                tmp / "one.h5",
                *rep,
            )
        )
    if "torchrun" in runs:
        threads = max(1, cores // 2)
        rows.append(
            embed_run(
                f"torchrun, 2 ranks x {threads} thread{'s' if threads > 1 else ''}",
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    "-m",
                    "elmo_fast",
                    "embed",
                    str(corpus),
                    str(tmp / "ranks.h5"),
                    *common,
                ],
                env,
                tmp / "ranks.h5",
                *rep,
            )
        )
    if "ray" in runs:
        rows.append(
            ray_run("Ray Data, 2 actors x 1 thread", corpus, model, tmp / "ray_out", 2, args.ray_batch_size, env, *rep)
        )
    tokens = rows[0]["tokens"]
    assert all(r["tokens"] == tokens for r in rows), [(r["label"], r["tokens"]) for r in rows]

    print(
        f"- machine: {cpu_name()}, {cores} cores; torch {torch.__version__}; Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at the end"
    )
    print(
        f"- corpus: {rows[0]['sentences']:,} sentences, {tokens:,} tokens (benchmarks/corpus.py, mean "
        f"{args.mean_tokens:g} tokens); model: random `{args.preset}`; output: each token's layer average "
        f"(embed --average, ElmoBatchEmbedder output='average')"
    )
    print(
        f"- command: `python benchmarks/bench_ray.py {' '.join(sys.argv[1:])}`; the fastest of {args.repeats} "
        f"runs each; embed --window {args.window}; Ray: read_text ({4 * 2} blocks) -> "
        f"map_batches(batch_size={args.ray_batch_size}) -> write_parquet"
    )
    print()
    print("| run | tokens/s, whole run | wall s | start s | read, embed, write s | steady tokens/s | other work |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        steady = f"{r['steady']:,.0f}" if r["steady"] is not None else "-"
        print(
            f"| {r['label']} | {tokens / r['wall']:,.0f} | {r['wall']:.2f} | {r['start']:.2f} | {r['work']:.2f} | "
            f"{steady} | {r['others']:.0%} |"
        )
    for r in rows:
        if "embed_busy" in r:
            embed = sum(r["embed_busy"]) / len(r["embed_busy"])
            start = sum(r["actor_start"]) / len(r["actor_start"])
            print()
            print(
                f"Ray's run: ray.init {r['ray_init']:.2f} s of its start, ray.shutdown {r['shutdown']:.2f} s at "
                f"the end; {r['actors_used']} actors ran "
                f"{r['calls']} calls; each actor, on average, started (process, imports, model) "
                f"{start:.2f} s into the pipeline and embedded for {embed:.2f} s (calls' own time); the rest of "
                f"the pipeline's {r['work']:.2f} s, {r['work'] - start - embed:.2f} s, is Ray's scheduling, "
                f"moving blocks, reading and writing parquet (and waiting for the slower actor)."
            )


if __name__ == "__main__":
    main()
