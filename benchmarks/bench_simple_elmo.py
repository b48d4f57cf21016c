#!/usr/bin/env python
"""elmo-fast's ``elmo_fast.simple_elmo.ElmoModel`` vs simple_elmo 0.9.2 on TensorFlow, one run, one model.

    python benchmarks/bench_simple_elmo.py                         # the original model's shapes, 1000 sentences
    python benchmarks/bench_simple_elmo.py --quick                 # a smoke run on the tiny shapes
    python benchmarks/bench_simple_elmo.py --update-benchmarks-md  # also rewrite its BENCHMARKS.md section

The model: an NLPL folder (options.json, model.hdf5, vocab.txt, meta.json) of random weights of the
``original`` preset's shapes (2048 filters, 2 highways, LSTM 4096 cells / 512 projection, 2 layers),
written once with elmo-fast's random-model writer. The texts: ``--sentences`` tokenized sentences of
news-like lengths (mean ~25 tokens, benchmarks/corpus.py). Each library runs in a fresh process:
elmo-fast here (a spawned child), simple_elmo as a subprocess of its side environment
(tests/fixtures/recorders/simple_elmo_peer.py; ``--peer-python``). Each times its import, ``load(dir,
max_batch_size)`` and ``--repeats`` calls of ``get_elmo_vectors(texts, warmup=True,
layers="average")``, the same call in both; tokens/s counts the texts' tokens over the call's time
(the warm-up pass over the first batch, which both do, is inside it; simple_elmo's call also opens
a TensorFlow session and initialises its variables from the HDF5 file, as every call of it does).
The two libraries' vectors from the first call are compared (max |difference|).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (REPO, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_cpu import _peak_rss_mb, machine_info  # noqa: E402
from corpus import _WORDS, make_sentences  # noqa: E402
from machine import machine_busy_s  # noqa: E402

DEFAULT_CACHE_DIR = Path("/tmp/elmo_fast_bench")
PEER_SCRIPT = REPO / "tests" / "fixtures" / "recorders" / "simple_elmo_peer.py"
DEFAULT_PEER = Path(os.environ.get("SIMPLE_ELMO_PYTHON", "/work/simple_elmo_env/bin/python"))
SYSTEMS = ("simple_elmo", "elmo-fast")


def ensure_model(preset: str, cache_dir: Path) -> Path:
    """An NLPL folder of a random model of ``preset``, written once under cache_dir."""
    from elmo_fast.durable import write_json, write_text
    from elmo_fast.formats.random_models import random_model

    directory = cache_dir / f"simple_elmo_{preset}"
    if not (directory / "model.hdf5").is_file():
        print(f"bench_simple_elmo: writing a random '{preset}' NLPL model to {directory}", file=sys.stderr)
        tmp = cache_dir / f".{directory.name}.tmp-{os.getpid()}"
        _, weights = random_model(preset, tmp)
        os.replace(weights, tmp / "model.hdf5")
        write_text(tmp / "vocab.txt", "\n".join(["</S>", "<S>", "<UNK>", *dict.fromkeys(_WORDS)]) + "\n")
        write_json(tmp / "meta.json", {"algorithm": {"name": "ELMo"}, "corpus": [{"description": "random weights"}]})
        tmp.rename(directory)
    return directory


def run_elmo_fast(cfg: dict) -> dict:
    import torch

    torch.set_num_threads(cfg["threads"])
    started = time.perf_counter()
    from elmo_fast.simple_elmo import ElmoModel

    imported = time.perf_counter()
    model = ElmoModel()
    model.load(cfg["path"], max_batch_size=cfg["batch_size"])
    loaded = time.perf_counter()
    times = []
    for _ in range(cfg["repeats"]):
        t0 = time.perf_counter()
        vectors = model.get_elmo_vectors(cfg["texts"], warmup=True, layers="average")
        times.append(time.perf_counter() - t0)
    if cfg.get("save_vectors"):
        np.save(cfg["save_vectors"], vectors.astype(np.float32))
    return {
        "import_s": imported - started,
        "load_s": loaded - imported,
        "call_s": times,
        "peak_rss_mb": _peak_rss_mb(),
        "version": _version("elmo-fast"),
        "backend": model.elmo_bilm.backend,
        "threads": torch.get_num_threads(),
    }


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _child(cfg: dict, conn) -> None:
    try:
        conn.send(run_elmo_fast(cfg))
    except BaseException as e:  # report, then exit: the parent prints it
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def _foreign(busy0: float | None, own_cpu: float, wall: float) -> float | None:
    busy1 = machine_busy_s()
    if busy0 is None or busy1 is None or wall <= 0:
        return None
    return max(0.0, (busy1 - busy0) - own_cpu) / (wall * (os.cpu_count() or 1))


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_row(system: str, cfg: dict, peer_python: Path, work: Path, timeout: float) -> dict:
    """One library in a fresh process; its times, and the share of the CPUs others used meanwhile."""
    busy0, cpu0, wall0 = machine_busy_s(), _children_cpu_s(), time.perf_counter()
    if system == "elmo-fast":
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(cfg, child))
        proc.start()
        child.close()
        if not parent.poll(timeout):
            proc.kill()
            raise RuntimeError(f"elmo-fast row ran past {timeout:.0f} s")
        out = parent.recv()
        proc.join()
        if "error" in out:
            raise RuntimeError(f"elmo-fast row failed: {out['error']}")
        # a spawned child's CPU time shows in RUSAGE_CHILDREN once it is joined
    else:
        plan = dict(cfg, warmup=True, layers="average")
        (work / "plan.json").write_text(json.dumps(plan))
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
        done = subprocess.run(
            [str(peer_python), str(PEER_SCRIPT), "bench", str(work / "plan.json"), str(work / "peer.json")],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"simple_elmo row failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        out = json.loads((work / "peer.json").read_text())
        out["version"] = subprocess.run(
            [
                str(peer_python),
                "-c",
                "import importlib.metadata as m; print(m.version('simple_elmo'), m.version('tensorflow-cpu'))",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()
    wall = time.perf_counter() - wall0
    out["foreign_cpu_fraction"] = _foreign(busy0, _children_cpu_s() - cpu0, wall)
    out["system"] = system
    return out


def markdown(result: dict) -> str:
    m = result["machine"]
    rows = {r["system"]: r for r in result["rows"]}
    base = rows.get("simple_elmo")
    lines = [
        "## simple_elmo on TensorFlow (`benchmarks/bench_simple_elmo.py`)",
        "",
        f"`elmo_fast.simple_elmo.ElmoModel` against simple_elmo's own `ElmoModel` "
        f"({base['version'] if base else 'not run'}), same NLPL folder, same `get_elmo_vectors(texts, "
        f'warmup=True, layers="average")` call ({result["sentences"]:,} sentences, {result["tokens"]:,} tokens, '
        f"`max_batch_size={result['batch_size']}`), each library in a fresh process, {result['repeats']} calls each. "
        + (
            "The model: random weights of the `original` model's shapes (2048 filters, 2 highways, LSTM 4096/512, "
            "2 layers). "
            if result["preset"] == "original"
            else f"The model: the `{result['preset']}` preset's shapes (a smoke run). "
        )
        + "simple_elmo's call opens a TensorFlow session and initialises its variables from `model.hdf5` every "
        "time (that is how it runs); both warm up on the first batch inside the call.",
        "",
        f"- machine: {m['cpu_model']} ({m['cpu_family_model']}), {m['logical_cpus']} logical CPUs"
        + (f" under {m['hypervisor']}" if m.get("hypervisor") else "")
        + f"; {m['memory_gb']} GB RAM; "
        f"torch {m['torch']}, {result['threads']} threads each; Python {m['python']}; {result['date']}",
        f"- load: {result['load_note']}",
        f"- command: `{result['command']}`",
        f"- the vectors agree: max |elmo-fast - simple_elmo| = {result['max_abs_diff']:.2e}"
        if result.get("max_abs_diff") is not None
        else "- vectors not compared",
        "",
        "| library | import s | load s | first call s | tokens/s (first) | best call s | tokens/s (best) "
        "| vs simple_elmo | peak RSS MB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name in ("simple_elmo", "elmo-fast"):
        r = rows.get(name)
        if r is None:
            continue
        busy = r["foreign_cpu_fraction"]
        mark = f" †{busy:.0%}" if busy is not None and busy >= 0.05 else ""
        first, best = r["call_s"][0], min(r["call_s"])
        speed = "(base)" if r is base or base is None else f"{min(base['call_s']) / best:.1f}x"
        rss = f"{r['peak_rss_mb']:,.0f}" if r.get("peak_rss_mb") else "-"
        label = name if name == "simple_elmo" else f"elmo-fast ({r['backend']})"
        lines.append(
            f"| {label} | {r['import_s']:.1f} | {r['load_s']:.1f} | {first:.1f} | "
            f"{result['tokens'] / first:,.0f}{mark} | {best:.1f} | {result['tokens'] / best:,.0f}{mark} | "
            f"{speed} | {rss} |"
        )
    lines += [
        "",
        "*import s*: importing the library (TensorFlow for simple_elmo). *load s*: `ElmoModel().load(dir)`. "
        "*tokens/s*: the texts' tokens over one call's time. A mark †N% says other processes kept N% of the "
        "machine's CPUs busy during the row.",
    ]
    return "\n".join(lines) + "\n"


_SECTION = re.compile(r"<!-- bench_simple_elmo:begin -->\n.*?<!-- bench_simple_elmo:end -->\n", re.S)


def update_benchmarks_md(path: Path, result: dict) -> None:
    from elmo_fast.durable import write_text

    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    section = f"<!-- bench_simple_elmo:begin -->\n{markdown(result)}<!-- bench_simple_elmo:end -->\n"
    text = _SECTION.sub(lambda _: section, old) if _SECTION.search(old) else old.rstrip("\n") + "\n\n" + section
    write_text(path, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="original", help="model shapes: original (default), small, tiny")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32, help="max_batch_size (simple_elmo's default 32)")
    p.add_argument("--repeats", type=int, default=2, help="calls per library (default 2)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--peer-python", type=Path, default=DEFAULT_PEER)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a row may take")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 40 sentences, one call each")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    p.add_argument("--update-benchmarks-md", action="store_true")
    p.add_argument("--benchmarks-md", type=Path, default=REPO / "BENCHMARKS.md")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="measure nothing: print (and with --update-benchmarks-md write) the results a --json run saved",
    )
    args = p.parse_args(argv)
    if args.from_json:
        result = json.loads(args.from_json.read_text())
        print(markdown(result))
        if args.update_benchmarks_md:
            update_benchmarks_md(args.benchmarks_md, result)
        return 0
    if args.quick:
        args.preset, args.sentences, args.repeats, args.batch_size = "tiny", 40, 1, 8
    systems = args.systems.split(",")
    if "simple_elmo" in systems and not args.peer_python.exists():
        print(
            f"bench_simple_elmo: simple_elmo's side environment is not at {args.peer_python}; "
            f"see tests/fixtures/recorders/simple_elmo_peer.py (or --systems elmo-fast)",
            file=sys.stderr,
        )
        return 2
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    model = ensure_model(args.preset, args.cache_dir)
    texts = make_sentences(args.sentences, seed=0)
    tokens = sum(map(len, texts))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for system in systems:
            cfg = {
                "path": str(model),
                "batch_size": args.batch_size,
                "repeats": args.repeats,
                "texts": texts,
                "threads": args.threads,
                "save_vectors": str(work / f"{system}.npy"),
            }
            print(f"bench_simple_elmo: {system} ...", file=sys.stderr, flush=True)
            rows.append(run_row(system, cfg, args.peer_python, work, args.timeout))
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        diff = None
        if len(rows) == 2:
            a, b = (np.load(work / f"{s}.npy") for s in systems)
            diff = float(np.abs(a - b).max())
    busy = [r["foreign_cpu_fraction"] for r in rows if r["foreign_cpu_fraction"] is not None]
    if not busy:
        load_note = "not measured (no /proc/stat)"
    elif max(busy) < 0.05:
        load_note = "the machine was otherwise idle during the rows (< 5% of the CPUs busy)"
    else:
        load_note = (
            f"other processes kept {min(busy):.0%}-{max(busy):.0%} of the CPUs busy during the rows "
            f"(a shared machine, loaded: rows marked †; compare the rows of one run, not across sections)"
        )
    import torch

    result = {
        "machine": machine_info(args.threads),
        "preset": args.preset,
        "sentences": len(texts),
        "tokens": tokens,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "threads": args.threads,
        "rows": rows,
        "max_abs_diff": diff,
        "load_note": load_note,
        "torch": torch.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python "
        + " ".join(
            shlex.quote(a) for a in ["benchmarks/bench_simple_elmo.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    print(markdown(result))
    if args.json:
        from elmo_fast.durable import write_json

        write_json(args.json, result, default=str)
    if args.update_benchmarks_md:
        update_benchmarks_md(args.benchmarks_md, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
