#!/usr/bin/env python
"""ONNX Runtime against elmo-fast's own paths, in one run: export time and file size per preset, the
quantized graphs' errors, and tokens/s of the reference, the fast path (fp32, bf16) and the exported graph in
ONNX Runtime (fp32, int8, int8-vnni) on one preset at batch 1 and 64.

    python benchmarks/bench_onnx.py                 # exports of small + original; speed on original, batches 1, 64
    python benchmarks/bench_onnx.py --quick         # tiny + small, a few seconds a row: a smoke run

Prints a markdown section ready to paste into BENCHMARKS.md (CPU from lscpu, date, command, load).

Each speed row runs in a fresh process (multiprocessing "spawn": ONNX Runtime's and torch's thread
pools never share one) with the same thread count (torch's, which --backend onnx gives ONNX Runtime
too): load, warm up on a few sentences the timed ones do not contain, then time
``ElmoEmbedder.embed_batch`` (char ids, the model, the copy out) over realistic sentences
(``corpus.make_sentences``) until they end or the row's time budget is spent. On a shared machine
other people's work moves every figure: ``--rounds N`` runs every row N times, the rows' order
rotated from round to round, and the table keeps each row's best round (with that round's load). As ``elmo-fast embed`` does, sentences are sorted by length in
windows of 1024 before being cut into batches, so a batch's rows have similar lengths. Tokens are
real tokens (no ``<S>``/``</S>``). The machine's load average is read before and after every row.
Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (HERE, REPO / "tests" / "support"):  # corpus.py, bench_cpu.py; onnx_graphs.py (the error measure)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

DEFAULT_CACHE_DIR = Path("/tmp/elmo_fast_bench")
WINDOW = 1024

#: (label, ElmoEmbedder arguments: backend, precision, which graph)
ROWS = [
    ("reference", dict(backend="reference"), None),
    ("fast fp32", dict(backend="fast", precision="fp32"), None),
    ("fast bf16", dict(backend="fast", precision="bf16"), None),
    ("onnx fp32", dict(backend="onnx"), "fp32"),
    ("onnx int8", dict(backend="onnx"), "int8"),
    ("onnx int8-vnni", dict(backend="onnx"), "int8-vnni"),
]
#: the graphs exported per preset: fp32 and each --quantize
GRAPHS = ("fp32", "int8", "int8-vnni")


def load_average() -> float:
    return os.getloadavg()[0]


def batches(sentences: list[list[str]], batch_size: int) -> list[list[list[str]]]:
    out = []
    for start in range(0, len(sentences), WINDOW):
        window = sorted(sentences[start : start + WINDOW], key=len)
        out.extend(window[i : i + batch_size] for i in range(0, len(window), batch_size))
    return out


def run_row(cfg: dict) -> dict:
    """One (label, batch size) row, in its own process."""
    from corpus import make_sentences

    from elmo_fast import ElmoEmbedder

    torch.set_num_threads(cfg["threads"])
    kwargs = dict(cfg["kwargs"])
    if cfg["graph"] is not None:
        kwargs["onnx_file"] = cfg["graph"]
    else:
        kwargs.update(options_file=cfg["options"], weight_file=cfg["weights"])
    started = time.perf_counter()
    embedder = ElmoEmbedder(batch_size=cfg["batch_size"], token_cache_mb=0, **kwargs)
    load_s = time.perf_counter() - started
    for batch in batches(make_sentences(cfg["warmup"], seed=99), 2):  # first use: calibration, allocations
        embedder.embed_batch(batch)
    load0 = load_average()
    tokens, sentences, times = 0, 0, []
    began = time.perf_counter()
    for batch in batches(make_sentences(cfg["sentences"], seed=0), cfg["batch_size"]):
        t0 = time.perf_counter()
        embedder.embed_batch(batch)
        times.append(time.perf_counter() - t0)
        tokens += sum(len(s) for s in batch)
        sentences += len(batch)
        if time.perf_counter() - began > cfg["seconds"]:
            break
    spent = sum(times)
    return {
        "tokens": tokens,
        "sentences": sentences,
        "tokens_per_s": tokens / spent,
        "p50_ms": 1e3 * float(np.median(times)),
        "load_s": load_s,
        "load_average": (load0, load_average()),
    }


def _child(cfg: dict, conn) -> None:
    try:
        conn.send(run_row(cfg))
    except BaseException as e:  # noqa: BLE001  (reported in the row)
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def run_isolated(cfg: dict) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(cfg, child))
    proc.start()
    child.close()
    result = parent.recv() if parent.poll(cfg["seconds"] * 20 + 1800) else {"error": "no answer"}
    proc.join(60)
    return result


def existing_exports(preset: str, cache_dir: Path) -> dict | None:
    """The graphs an earlier run of this script left in cache_dir (--speed-only), or None."""
    from bench_cpu import ensure_model

    paths = {q: cache_dir / f"{preset}-{q}.onnx" for q in GRAPHS}
    if not all(p.is_file() for p in paths.values()):
        return None
    options, weights = ensure_model(preset, cache_dir)
    return {"options": options, "weights": weights, **{q: {"path": str(p)} for q, p in paths.items()}}


def export(preset: str, cache_dir: Path, threads: int) -> dict:
    """Export the preset's random model in fp32 and each quantization (timed; file sizes), and measure
    each quantized graph's error against fp32 on realistic sentences, batches of 16."""
    from bench_cpu import ensure_model
    from corpus import make_sentences
    from onnx_graphs import quantization_error

    from elmo_fast import batch_to_ids
    from elmo_fast.embedding.onnx_backend import OnnxBiLm
    from elmo_fast.export.onnx_file import export_onnx, quantize_onnx
    from elmo_fast.formats.bilm_tf import load_model_files

    options, weights = ensure_model(preset, cache_dir)
    loaded = load_model_files(options, weights)
    out = {"options": options, "weights": weights}
    for graph in GRAPHS:
        path = cache_dir / f"{preset}-{graph}.onnx"
        load0 = load_average()
        if graph == "fp32":
            report = export_onnx(loaded, path)
        else:  # the fp32 graph quantized: an export with quantize= traces the model again first
            report = quantize_onnx(out["fp32"]["path"], path, graph)
        out[graph] = {
            "path": str(path),
            "seconds": report.seconds,
            "mb": report.size_bytes / 1e6,
            "load_average": (load0, load_average()),
        }
    fp32 = OnnxBiLm(out["fp32"]["path"], threads)
    for graph in GRAPHS[1:]:
        quantized = OnnxBiLm(out[graph]["path"], threads)
        worst = {"max_rel": 0.0, "rms_rel": 0.0, "min_cosine": 1.0}
        for batch in batches(make_sentences(64, seed=7), 16):
            ids = batch_to_ids(batch)
            a, mask = fp32.embed(ids)
            b, _ = quantized.embed(ids)
            e = quantization_error(a, b, mask)
            worst = {
                "max_rel": max(worst["max_rel"], e["max_rel"]),
                "rms_rel": max(worst["rms_rel"], e["rms_rel"]),
                "min_cosine": min(worst["min_cosine"], e["min_cosine"]),
            }
        out[graph]["error"] = worst
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny + small, short rows: a smoke run")
    p.add_argument("--export-presets", help="presets exported, timed and sized (default small,original)")
    p.add_argument("--speed-preset", help="the preset of the speed rows (default original)")
    p.add_argument("--batch-sizes", help="batch sizes of the speed rows (default 1,64)")
    p.add_argument("--seconds", type=float, help="time budget of a speed row (default 30)")
    p.add_argument("--sentences", type=int, help="sentences available to a speed row (default 2048)")
    p.add_argument(
        "--speed-only",
        action="store_true",
        help="no export table: the speed rows on the graphs an earlier run left in --cache-dir (exported if missing)",
    )
    p.add_argument("--rounds", type=int, default=2, help="runs of every row; the best is kept (default 2)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads of every row")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="random models and graphs")
    args = p.parse_args(argv)
    quick = args.quick
    export_presets = (args.export_presets or ("tiny,small" if quick else "small,original")).split(",")
    speed_preset = args.speed_preset or ("small" if quick else "original")
    batch_sizes = [int(b) for b in (args.batch_sizes or ("1,8" if quick else "1,64")).split(",")]
    seconds = args.seconds if args.seconds is not None else (2.0 if quick else 30.0)
    n_sentences = args.sentences or (64 if quick else 2048)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)

    from bench_cpu import machine_info, machine_key

    info = machine_info(args.threads)
    load_start = os.getloadavg()
    exports = {}
    for preset in dict.fromkeys([*export_presets, speed_preset]):
        if args.speed_only and preset != speed_preset:
            continue
        if args.speed_only and (found := existing_exports(preset, args.cache_dir)) is not None:
            exports[preset] = found
            continue
        print(f"bench_onnx: exporting {preset} ({', '.join(GRAPHS)})", file=sys.stderr)
        exports[preset] = export(preset, args.cache_dir, args.threads)
    model = exports[speed_preset]
    plan = [(label, kwargs, graph, b) for b in batch_sizes for label, kwargs, graph in ROWS]
    best: dict[tuple[str, int], dict] = {}
    for round_ in range(args.rounds):
        shift = round_ * len(plan) // max(args.rounds, 1)
        for label, kwargs, graph, batch_size in plan[shift:] + plan[:shift]:
            cfg = dict(
                kwargs=kwargs,
                graph=model[graph]["path"] if graph else None,
                options=model["options"],
                weights=model["weights"],
                batch_size=batch_size,
                threads=args.threads,
                seconds=seconds,
                sentences=n_sentences,
                warmup=4,
            )
            print(f"bench_onnx: round {round_ + 1}: {speed_preset} {label} batch {batch_size}", file=sys.stderr)
            row = {"label": label, "batch_size": batch_size, **run_isolated(cfg)}
            kept = best.get((label, batch_size))
            if kept is None or "error" in kept or row.get("tokens_per_s", 0) > kept.get("tokens_per_s", 0):
                best[(label, batch_size)] = row
    rows = [best[(label, b)] for label, _, _, b in plan]
    load_end = os.getloadavg()

    import onnx
    import onnxruntime

    from elmo_fast.export.quantize import cpu_has_vnni

    command = "python benchmarks/bench_onnx.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print("## ONNX Runtime (`benchmarks/bench_onnx.py`)\n")
    print(f"- machine: {machine_key(info)}")
    print(
        f"- CPU: {info['cpu_model']} ({info['cpu_family_model']}; lscpu), {info['logical_cpus']} logical CPUs, "
        f"{info['hypervisor'] or 'no'} hypervisor, VNNI: {'yes' if cpu_has_vnni() else 'no'}; {args.threads} threads "
        f"for every row (torch's and ONNX Runtime's)"
    )
    print(
        f"- torch {torch.__version__}, onnxruntime {onnxruntime.__version__} (CPUExecutionProvider), "
        f"onnx {onnx.__version__}; Python {info['python']}"
    )
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; command: `{command}`")
    print(
        f"- load average (1 min) at the start {load_start[0]:.1f}, at the end {load_end[0]:.1f} "
        f"(on {info['logical_cpus']} CPUs: the machine is shared; each row gives its own)"
    )
    print(
        f"- random weights of the official shapes; sentences from benchmarks/corpus.py (mean ~25 tokens), "
        f"sorted by length in windows of {WINDOW}, as `elmo-fast embed` batches them; token cache off\n"
    )
    if not args.speed_only:
        print(
            "**Export** (fp32: `export_onnx`: trace, onnx.checker, ONNX Runtime's load check, durable write; "
            "int8, int8-vnni: `quantize_onnx` of the fp32 graph: quantization and the same checks)\n"
        )
        print(
            "| preset | graph | seconds | MB | vs fp32: max err / layer max | RMS err / layer RMS "
            "| min cosine of the averaged layers | load avg |"
        )
        print("|---|---|--:|--:|--:|--:|--:|--:|")
        for preset, e in exports.items():
            for graph in GRAPHS:
                g, q = e[graph], e[graph].get("error")
                error = (
                    f"{100 * q['max_rel']:.1f}% | {100 * q['rms_rel']:.1f}% | {q['min_cosine']:.5f}"
                    if q
                    else "- | - | -"
                )
                print(
                    f"| {preset} | {graph} | {g['seconds']:.1f} | {g['mb']:.1f} | {error} | "
                    f"{g['load_average'][0]:.1f}-{g['load_average'][1]:.1f} |"
                )
    print(
        f"\n**Speed**: `{speed_preset}`, tokens/s (one run, the best of {args.rounds} rounds per row; the ratio "
        f"against fast fp32 at the same batch size)\n"
    )
    print("| path | batch | sentences | tokens/s | p50 ms/batch | vs fast fp32 | load avg (row) |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for batch_size in batch_sizes:
        base = next((r for r in rows if r["label"] == "fast fp32" and r["batch_size"] == batch_size), {})
        for r in (r for r in rows if r["batch_size"] == batch_size):
            if "error" in r:
                print(f"| {r['label']} | {batch_size} | - | - | - | - | failed: {r['error']} |")
                continue
            ratio = r["tokens_per_s"] / base["tokens_per_s"] if base.get("tokens_per_s") else float("nan")
            print(
                f"| {r['label']} | {batch_size} | {r['sentences']} | {r['tokens_per_s']:,.0f} | {r['p50_ms']:.1f} | "
                f"{ratio:.2f}x | {r['load_average'][0]:.1f}-{r['load_average'][1]:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
