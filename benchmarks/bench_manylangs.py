#!/usr/bin/env python
"""elmo-fast vs ELMoForManyLangs (``elmoformanylangs``) on one ELMoForManyLangs model, in one run.

    python benchmarks/bench_manylangs.py                         # batch 64 and 1, ~1 min per row
    python benchmarks/bench_manylangs.py --quick                 # a smoke run on the tiny shapes
    python benchmarks/bench_manylangs.py --update-benchmarks-md  # also rewrite its BENCHMARKS.md section

The model is a random-weight directory of the released models' shapes (cnn_50_100_512_4096_sample:
2048 filters, char dim 50, word dim 100, 2 highways, LSTM 4096 cells / 512 projection, 2 layers)
with 70,000 words and 3,000 characters, written once in ELMoForManyLangs' own layout. Every row
runs in a fresh process: it loads the directory with that row's library, warms up on other
sentences, then calls ``Embedder(dir, batch_size).sents2elmo(chunk, output_layer=-2)`` (the same
call for both libraries) on chunks of the corpus until the corpus ends or the time budget is
spent. tokens/s counts real tokens (not <bos>/<eos>) over the time inside sents2elmo.

The corpus: sentences of log-normal length (mean 25 tokens), words drawn Zipf-style from the
model's vocabulary, 5% of them out of it. ELMoForManyLangs runs as users run it (stateful, its
batches in random order); elmo-fast stateless, its token cache on (the default, 256 MB).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (REPO, HERE):  # this tree's elmo_fast (not another installed copy), and bench_cpu beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_cpu import (  # noqa: E402
    _foreign,
    _own_cpu_s,
    _peak_rss_mb,
    flops_per_token,
    gemm_rate,
    machine_info,
    wait_quiet,
)
from machine import machine_busy_s  # noqa: E402

DEFAULT_CACHE_DIR = Path("/tmp/elmo_fast_bench")
N_WORDS, N_CHARS = 70_000, 3_000
SYSTEMS = ("elmoformanylangs", "elmo-fast fp32", "elmo-fast bf16")
DEFAULT_SYSTEMS = "elmoformanylangs,elmo-fast fp32"  # bf16 on request: it needs bf16 instructions to pay


def model_chars(n: int) -> str:
    """n characters: the testing alphabet (Latin, Cyrillic, some CJK), then CJK ideographs."""
    from elmo_fast.formats.random_models import MANYLANGS_CHARS

    chars = list(dict.fromkeys(MANYLANGS_CHARS))
    code = 0x4E00
    while len(chars) < n:
        c = chr(code)
        if c not in chars:
            chars.append(c)
        code += 1
    return "".join(chars[:n])


def ensure_model(preset: str, cache_dir: Path, n_words: int, n_chars: int) -> Path:
    from elmo_fast.formats.random_models import random_manylangs_model

    directory = cache_dir / f"manylangs_{preset}_{n_words}w_{n_chars}c"
    if not (directory / "encoder.pkl").is_file():
        print(f"bench_manylangs: writing a random '{preset}' ELMoForManyLangs model to {directory}", file=sys.stderr)
        tmp = cache_dir / f".{directory.name}.tmp-{os.getpid()}"
        random_manylangs_model(preset, tmp, n_words=n_words, chars=model_chars(n_chars), legacy_format=True)
        tmp.rename(directory)
    return directory


def make_corpus(model_dir: Path, n: int, seed: int, mean_tokens: float = 25.0) -> list[list[str]]:
    from elmo_fast.formats.manylangs_dir import read_dictionary

    words = [w for w in read_dictionary(model_dir / "word.dic") if not w.startswith("<")]
    rng = np.random.default_rng(seed)
    sigma = 0.5
    lengths = np.clip(np.round(rng.lognormal(np.log(mean_tokens) - sigma**2 / 2, sigma, n)), 1, 120).astype(int)
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    out = []
    for length in lengths:
        sentence = [str(w) for w in rng.choice(words, size=length, p=p)]
        for i in np.nonzero(rng.random(length) < 0.05)[0]:  # out of the vocabulary: a known word, altered
            sentence[i] = sentence[i] + "x"
        out.append(sentence)
    return out


def run_one(cfg: dict) -> dict:
    torch.set_num_threads(cfg["threads"])
    model_dir, bs, budget, system = Path(cfg["model_dir"]), cfg["batch_size"], cfg["seconds"], cfg["system"]
    start = time.perf_counter()
    if system == "elmoformanylangs":
        import logging

        logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)
        from elmoformanylangs import Embedder as TheirEmbedder

        with mock.patch("torch.cuda.is_available", return_value=False):  # the CPU, as elmo-fast's rows
            embedder = TheirEmbedder(str(model_dir), batch_size=bs)
        version = "elmoformanylangs " + _version("elmoformanylangs")
    else:
        from elmo_fast.manylangs import Embedder

        dtype = torch.bfloat16 if system.endswith("bf16") else torch.float32
        embedder = Embedder(model_dir, batch_size=bs, dtype=dtype)
        version = "elmo-fast " + _version("elmo-fast")
    load_s = time.perf_counter() - start
    chunk = bs * 2 if bs > 1 else 8  # sentences per sents2elmo call
    warm = make_corpus(model_dir, bs if bs > 1 else 4, seed=1)
    t = time.perf_counter()
    embedder.sents2elmo(warm, output_layer=-2)
    warm_s = time.perf_counter() - t
    corpus = make_corpus(model_dir, cfg["sentences"], seed=0)
    n_sent = n_tok = 0
    total = 0.0
    busy0, own0, wall0 = machine_busy_s(), _own_cpu_s(), time.perf_counter()
    for i in range(0, len(corpus), chunk):
        part = corpus[i : i + chunk]
        t = time.perf_counter()
        out = embedder.sents2elmo(part, output_layer=-2)
        total += time.perf_counter() - t
        assert len(out) == len(part) and out[0].shape[1] == len(part[0])
        n_sent += len(part)
        n_tok += sum(len(s) for s in part)
        if total >= budget:
            break
    return {
        "system": system,
        "version": version,
        "batch_size": bs,
        "load_s": load_s,
        "warmup_s": warm_s,
        "sentences": n_sent,
        "tokens": n_tok,
        "seconds": total,
        "tokens_per_s": n_tok / total,
        "budget_hit": n_sent < len(corpus),
        "peak_rss_mb": _peak_rss_mb(),
        "foreign_cpu_fraction": _foreign(busy0, own0, wall0),
        "torch_threads": torch.get_num_threads(),
    }


def _gflops(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def model_flops(model_dir: Path) -> dict[str, int]:
    """Nominal FLOPs per token (bench_cpu's formula, the projection reading the word embedding too)."""
    from elmo_fast.formats.manylangs_dir import load_config

    config, _ = load_config(model_dir)
    out = flops_per_token(config)
    out["projection"] += 2 * config.word_dim * config.projection_dim
    out["total"] += 2 * config.word_dim * config.projection_dim
    return out


def _row(r: dict, base: dict | None, flops: int, sgemm: float | None) -> str:
    busy = r["foreign_cpu_fraction"]
    mark = f" †{busy:.0%}" if busy is not None and busy >= 0.05 else ""
    speed = "(base)" if base is None or base is r else f"{r['tokens_per_s'] / base['tokens_per_s']:.1f}x"
    sents = f"{r['sentences']}" + (" (budget)" if r["budget_hit"] else "")
    gflops = r["tokens_per_s"] * flops / 1e9
    share = f"{gflops / sgemm:.0%}" if sgemm else "-"
    return (
        f"| {r['system']} | {r['batch_size']} | {sents} | {r['tokens']:,} | {r['tokens_per_s']:,.0f}{mark} | "
        f"{speed} | {gflops:.1f} | {share} | {r['load_s']:.1f} | {r['peak_rss_mb']:,.0f} |"
    )


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        "## ELMoForManyLangs models (`benchmarks/bench_manylangs.py`)",
        "",
        f"elmo-fast's `elmo_fast.manylangs.Embedder` against ELMoForManyLangs' own `Embedder` "
        f"({result['their_version']}), same model directory, same `sents2elmo(chunk, output_layer=-2)` "
        f"calls, each row in a fresh process. The model: random weights of "
        + (
            "the released models' shapes (2048 filters, char dim 50, word dim 100, 2 highways, LSTM 4096/512, 2 layers), "
            if result["preset"] == "released"
            else f"the '{result['preset']}' preset's shapes (a smoke run), "
        )
        + f"{result['n_words']:,} words and {result['n_chars']:,} characters, in ELMoForManyLangs' layout (legacy "
        f"pickles). Sentences: mean 25 tokens, words Zipf-drawn from the vocabulary, 5% out of it. "
        f"ELMoForManyLangs runs as users run it (stateful, its batches in random order); elmo-fast stateless, "
        f"fast path, token cache on (its default).",
        "",
        f"- machine: {m['cpu_model']} ({m['cpu_family_model']}), {m['logical_cpus']} logical CPUs"
        + (f" under {m['hypervisor']}" if m.get("hypervisor") else "")
        + f"; {m['memory_gb']} GB RAM; "
        f"torch {m['torch']} (CPU capability {m['cpu_capability']}; bf16 instructions: "
        f"{', '.join(m['bf16_hardware']) or 'none'}), {m['torch_threads']} threads; Python {m['python']}; {m['date']}",
        f"- load: {result['load_note']}",
        f"- command: `{result['command']}`",
        f"- GEMM rate (2048^3, median of 10, the same threads): fp32 **{_gflops(result['sgemm'])} GFLOP/s**; "
        f"nominal FLOPs per token {result['flops']['total'] / 1e6:.1f} M (char CNN "
        f"{result['flops']['char_cnn'] / 1e6:.1f}, highway {result['flops']['highway'] / 1e6:.1f}, projection "
        f"{result['flops']['projection'] / 1e6:.1f}, LSTM {result['flops']['lstm'] / 1e6:.1f}; bench_cpu.py's formula)",
        "",
        "| library | batch | sentences | tokens | tokens/s | vs ELMoForManyLangs | GFLOP/s | % SGEMM | load s | peak RSS MB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for bs in result["batch_sizes"]:
        rows = [r for r in result["rows"] if r["batch_size"] == bs]
        base = next((r for r in rows if r["system"] == "elmoformanylangs"), None)
        lines += [_row(r, base, result["flops"]["total"], result["sgemm"]) for r in rows]
    lines += [
        "",
        '*tokens/s*: real tokens over the time inside `sents2elmo`, after one warm-up call; "(budget)": the '
        f"time budget ({result['seconds']:.0f} s a row) ended the row before its corpus. *load s*: "
        "`Embedder(dir)`, files read. *GFLOP/s*: tokens/s times the nominal FLOPs per token (useful work "
        "only: padding and recomputed duplicates are not credited), *% SGEMM* its share of the GEMM rate. "
        "A mark †N% says other processes kept N% of the machine's CPUs busy during the row.",
    ]
    return "\n".join(lines) + "\n"


_SECTION = re.compile(r"<!-- bench_manylangs:begin -->\n.*?<!-- bench_manylangs:end -->\n", re.S)


def update_benchmarks_md(path: Path, result: dict) -> None:
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    section = f"<!-- bench_manylangs:begin -->\n{markdown(result)}<!-- bench_manylangs:end -->\n"
    text = _SECTION.sub(lambda _: section, old) if _SECTION.search(old) else old.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="64,1")
    p.add_argument(
        "--systems",
        default=DEFAULT_SYSTEMS,
        help=f"comma-separated, of {', '.join(SYSTEMS)} (default {DEFAULT_SYSTEMS})",
    )
    p.add_argument("--seconds", type=float, default=45.0, help="time budget of each row's measurement (default 45)")
    p.add_argument("--sentences", type=int, default=2048, help="corpus size (default 2048)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--preset", default="released", help="model shapes: released (default) or tiny")
    p.add_argument("--words", type=int, default=N_WORDS)
    p.add_argument("--chars", type=int, default=N_CHARS)
    p.add_argument("--quick", action="store_true", help="tiny shapes, 2 s a row")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for other processes to quieten before each row",
    )
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    p.add_argument("--update-benchmarks-md", action="store_true")
    p.add_argument("--benchmarks-md", type=Path, default=REPO / "BENCHMARKS.md")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.preset, args.seconds, args.sentences, args.words, args.chars = "tiny", 2.0, 128, 2000, 300
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    model_dir = ensure_model(args.preset, args.cache_dir, args.words, args.chars)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    torch.set_num_threads(args.threads)
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    sgemm, _ = gemm_rate(torch.float32, 2048, 10)
    systems = args.systems.split(",")
    ctx = mp.get_context("spawn")
    rows, busy_before = [], []
    for bs in batch_sizes:
        for system in systems:
            if args.wait_quiet:
                busy_before.append(wait_quiet(args.wait_quiet))
            cfg = dict(
                system=system,
                model_dir=str(model_dir),
                batch_size=bs,
                seconds=args.seconds,
                sentences=args.sentences,
                threads=args.threads,
            )
            with ctx.Pool(1) as pool:
                r = pool.apply(run_one, (cfg,))
            rows.append(r)
            busy = r["foreign_cpu_fraction"]
            print(
                f"{system:18s} batch {bs:3d}: {r['tokens_per_s']:9,.1f} tokens/s ({r['tokens']} tokens in "
                f"{r['seconds']:.1f} s; load {r['load_s']:.1f} s; others busy "
                f"{'?' if busy is None else f'{busy:.0%}'})",
                file=sys.stderr,
                flush=True,
            )
    busy = [r["foreign_cpu_fraction"] for r in rows if r["foreign_cpu_fraction"] is not None]
    note = (
        f"other processes kept {min(busy):.0%}-{max(busy):.0%} of the CPUs busy during the rows" if busy else "unknown"
    )
    if busy and max(busy) >= 0.05:
        note += " (a shared machine, loaded: rows marked †; compare rows of one run, not with other sections)"
    their = next((r["version"] for r in rows if r["system"] == "elmoformanylangs"), "elmoformanylangs (not run)")
    result = {
        "machine": machine_info(args.threads),
        "rows": rows,
        "batch_sizes": batch_sizes,
        "seconds": args.seconds,
        "n_words": args.words,
        "n_chars": args.chars,
        "their_version": their,
        "load_note": note,
        "preset": args.preset,
        "sgemm": sgemm,
        "flops": model_flops(model_dir),
        "command": "python benchmarks/bench_manylangs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.update_benchmarks_md:
        update_benchmarks_md(args.benchmarks_md, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
