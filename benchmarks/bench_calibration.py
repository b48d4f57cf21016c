"""The CPU calibration (elmo_fast/tuning/) on a busy machine, and what it costs at first use.

    python benchmarks/bench_calibration.py [--cache-dir DIR] [--seconds 20] [--repeats 3] [--threads 2]
                                           [--cost-presets tiny,small,original] [--skip-busy] [--skip-cost]

* busy vs quiet: `original` (random weights), fp32. A calibration made while two other processes (spinning
  loops this script starts and stops) keep both cores busy, and one made after they stop; then, with the
  spinners gone, tokens/s at batch 64 of each choice and of the kernels' defaults, each row its own process,
  the three interleaved over --repeats rounds (median). The target: the busy choice at >= 95% of the quiet
  one's speed. Also what a later process does with the busy record (re-checked, measured again if quiet).
* cost at first use, per model (each in a fresh process, each with an empty store): the calibration itself
  (what the first forward of a shape pays once per machine), then a later process's store read and
  re-check. SeqVec's shape is `original`'s (tests/compat/test_seqvec.py): the same key, the same numbers.

Every phase records the 1-minute load average and the share of the CPUs other processes kept busy (from
/proc/stat, this run's own processes' CPU time subtracted); a calibration, how long its threads ran (the
rest they waited for a CPU). Prints markdown tables ready to paste into
BENCHMARKS.md, with the CPU (lscpu's model name, family and model), the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from machine import machine_busy_s  # noqa: E402

SPIN = "while True: pass"


def _lscpu() -> dict[str, str]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}


def machine() -> str:
    ls = _lscpu()
    return (
        f"{ls.get('Model name', platform.processor() or '?')} (family {ls.get('CPU family', '?')} model "
        f"{ls.get('Model', '?')}), {os.cpu_count()} logical CPUs"
    )


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + s.ru_utime + s.ru_stime


class Phase:
    """The load average and other processes' share of the CPUs over a phase of this run."""

    def __enter__(self):
        self.load0 = os.getloadavg()[0]
        self.busy0, self.own0, self.wall0 = machine_busy_s(), _children_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.wall0
        busy1, own1 = machine_busy_s(), _children_cpu_s()
        self.load = max(self.load0, os.getloadavg()[0])
        self.foreign = (
            None
            if self.busy0 is None or busy1 is None or wall <= 0
            else max(0.0, (busy1 - self.busy0) - (own1 - self.own0)) / (wall * (os.cpu_count() or 1))
        )
        return False

    def text(self) -> str:
        other = "?" if self.foreign is None else f"{self.foreign:.0%}"
        return f"load {self.load:.1f}, others {other} of the CPUs"


# ---- the workers (each in its own process) ---------------------------------------------------------------


def _model(cfg: dict):
    from elmo_fast import ElmoBiLm

    return ElmoBiLm(cfg["options"], cfg["weights"], precision=cfg.get("precision", "fp32"))


def worker_calibrate(cfg: dict) -> dict:
    """First use of a shape (or a later process's, with a store): the time ``cpu_tuning()`` takes."""
    import torch

    torch.set_num_threads(cfg["threads"])
    from elmo_fast.tuning import cpu_tuning, store

    bilm = _model(cfg)
    start = time.perf_counter()
    tuning = bilm.cpu_tuning()
    seconds = time.perf_counter() - start
    records = [r for _, r in store.records() if r is not None and r.key["precision"] == cfg.get("precision", "fp32")]
    record = records[-1] if records else None
    return {
        "seconds": seconds,
        "tuning": tuning.to_dict(),
        "describe": tuning.describe(),
        "activity": list(cpu_tuning.activity.values()),
        "busy": None if record is None else record.busy,
        "complete": None if record is None else record.data.get("complete"),
        "margin": None if record is None else record.margin,
        "spread": None if record is None else record.spread,
    }


def worker_throughput(cfg: dict) -> dict:
    """tokens/s of ElmoEmbedder at cfg["batch"] with exactly cfg["tuning"] (None: the kernels' defaults)."""
    import torch

    torch.set_num_threads(cfg["threads"])
    from corpus import make_sentences

    from elmo_fast import ElmoEmbedder
    from elmo_fast.bilm import cpu_choices
    from elmo_fast.bilm.cpu_choices import DEFAULT, CpuTuning

    tuning = DEFAULT if cfg["tuning"] is None else CpuTuning.from_dict(cfg["tuning"])
    cpu_choices.install(lambda *args: tuning)
    embedder = ElmoEmbedder(cfg["options"], cfg["weights"], batch_size=cfg["batch"])
    bs = cfg["batch"]
    embedder.embed_batch(make_sentences(bs, seed=1))  # warm-up: packed copies, oneDNN's kernels
    sentences = make_sentences(40 * bs, seed=0)
    tokens, total = 0, 0.0
    for i in range(0, len(sentences), bs):
        batch = sentences[i : i + bs]
        t = time.perf_counter()
        embedder.embed_batch(batch)
        total += time.perf_counter() - t
        tokens += sum(len(s) for s in batch)
        if total >= cfg["seconds"]:
            break
    assert embedder.elmo_bilm.cpu_tuning() == tuning
    return {"tokens_per_s": tokens / total, "seconds": total}


WORKERS = {"calibrate": worker_calibrate, "throughput": worker_throughput}


def run_worker(kind: str, cfg: dict, env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", kind, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- the phases -----------------------------------------------------------------------------------------


def ensure_model(preset: str, cache: Path) -> tuple[str, str]:
    from elmo_fast.formats.random_models import random_model

    directory = cache / preset
    if not (directory / "weights.hdf5").is_file():
        print(f"bench_calibration: writing a random '{preset}' model to {directory}", file=sys.stderr)
        random_model(preset, directory, seed=0)
    return str(directory / "options.json"), str(directory / "weights.hdf5")


def fresh_store(cache: Path, name: str) -> dict[str, str]:
    directory = Path(tempfile.mkdtemp(prefix=f"{name}_", dir=cache))
    return {"ELMO_FAST_CACHE": str(directory), "ELMO_FAST_CALIBRATION": "on"}


def busy_vs_quiet(args, cache: Path) -> tuple[str, dict]:
    options, weights = ensure_model(args.busy_preset, cache)
    base = {"options": options, "weights": weights, "threads": args.threads, "precision": "fp32"}
    busy_env, quiet_env = fresh_store(cache, "busy"), fresh_store(cache, "quiet")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        time.sleep(1.0)
        with Phase() as p_busy:
            busy = run_worker("calibrate", base, busy_env)
    finally:
        for s in spinners:
            s.kill()
        for s in spinners:
            s.wait()
    time.sleep(2.0)
    with Phase() as p_quiet:
        quiet = run_worker("calibrate", base, quiet_env)
    choices = {"busy": busy["tuning"], "quiet": quiet["tuning"], "defaults": None}
    rates: dict[str, list[float]] = {k: [] for k in choices}
    with Phase() as p_speed:
        for _ in range(args.repeats):
            for name, tuning in choices.items():
                cfg = {**base, "tuning": tuning, "batch": 64, "seconds": args.seconds}
                rates[name].append(run_worker("throughput", cfg)["tokens_per_s"])
    with Phase() as p_later:
        later = run_worker("calibrate", base, busy_env)
    median = {k: statistics.median(v) for k, v in rates.items()}
    ratio = median["busy"] / median["quiet"]
    rows = [
        "| calibration | made while | its choice | margin (spread) | waiting for a CPU | tokens/s, batch 64 (median; runs) |",
        "|---|---|---|--:|--:|--:|",
    ]
    for name, made, phase in (("busy", busy, p_busy), ("quiet", quiet, p_quiet)):
        margin = "-" if made["margin"] is None else f"{made['margin']:.1%} ({made['spread']:.1%})"
        busy_share = "-" if made["busy"] is None else f"{made['busy']:.0%}"
        runs = ", ".join(f"{r:,.0f}" for r in rates[name])
        rows.append(
            f"| {name} | {phase.text()}; {made['seconds']:.1f} s | {made['describe']} | {margin} | {busy_share} | "
            f"**{median[name]:,.0f}** ({runs}) |"
        )
    runs = ", ".join(f"{r:,.0f}" for r in rates["defaults"])
    rows.append(f"| off (the kernels' defaults) | - | - | - | - | {median['defaults']:,.0f} ({runs}) |")
    text = "\n".join(rows)
    text += (
        f"\n\nThe busy choice ran at **{ratio:.1%}** of the quiet choice's speed (target >= 95%); the defaults at "
        f"{median['defaults'] / median['quiet']:.1%}. Throughput rows: {p_speed.text()}. A later process with the "
        f"busy record ({p_later.text()}): {'; '.join(later['activity']) or 'read it'} -> {later['describe']}."
    )
    return text, {"busy": busy, "quiet": quiet, "rates": rates, "ratio": ratio, "later": later}


def first_use_cost(args, cache: Path) -> tuple[str, dict]:
    rows = [
        "| model (LSTM P x C) | precision | first use: calibration (of it, running) | later process: read + "
        "re-check | choice | while |",
        "|---|---|--:|--:|---|---|",
    ]
    from elmo_fast.formats.random_models import PRESETS

    out = {}
    for preset in args.cost_presets:
        options, weights = ensure_model(preset, cache)
        o = PRESETS[preset]
        for precision in ("fp32", "bf16"):
            env = fresh_store(cache, f"cost_{preset}_{precision}")
            cfg = {"options": options, "weights": weights, "threads": args.threads, "precision": precision}
            with Phase() as phase:
                first = run_worker("calibrate", cfg, env)
                later = run_worker("calibrate", cfg, env)
            out[f"{preset} {precision}"] = {"first": first, "later": later}
            name = f"`{preset}`" + (" (SeqVec's shape)" if preset == "original" else "")
            running = "" if first["busy"] is None else f" ({first['seconds'] * (1 - first['busy']):.2f} s)"
            done = "" if first["complete"] in (None, True) else ", budget spent"
            rows.append(
                f"| {name} ({o.projection_dim} x {o.cell_dim}) | {precision} | {first['seconds']:.2f} s{running}{done} | "
                f"{later['seconds'] * 1e3:.0f} ms | {first['describe']} | {phase.text()} |"
            )
    return "\n".join(rows), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "bench_calibration"))
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per throughput row (default 20)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of the three throughput rows (default 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--cost-presets", default="tiny,small,original", help="models whose first use is timed")
    p.add_argument("--busy-preset", default="original", help="the model of the busy-vs-quiet figure (default original)")
    p.add_argument("--skip-busy", action="store_true", help="no busy-vs-quiet figure")
    p.add_argument("--skip-cost", action="store_true", help="no first-use cost table")
    p.add_argument("--json", help="also write every number to this file")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        kind, cfg = args.worker
        print(json.dumps(WORKERS[kind](json.loads(cfg))))
        return 0
    args.cost_presets = [x for x in args.cost_presets.split(",") if x]
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    import torch

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python benchmarks/bench_calibration.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    header = (
        f"- host: {machine()}; torch {torch.__version__}; {args.threads} threads; {date}\n"
        f"- command: `{command.strip()}`"
    )
    results: dict = {}
    sections = [header]
    if not args.skip_busy:
        text, results["busy_vs_quiet"] = busy_vs_quiet(args, cache)
        sections += [f"Busy vs quiet (`{args.busy_preset}`, fp32, batch 64):", text]
    if not args.skip_cost:
        text, results["first_use"] = first_use_cost(args, cache)
        sections += ["Cost at first use (an empty store; then a later process with the store):", text]
    report = "\n\n".join(sections)
    print(report)
    if args.json:
        from elmo_fast.durable import write_json

        write_json(args.json, results, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
