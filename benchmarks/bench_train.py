#!/usr/bin/env python
"""Whole training steps of `elmo-fast train`: tokens/s with the fast ops' backward passes vs the
reference stages under autograd, and the share the sampled softmax (and Adagrad) take.

    python benchmarks/bench_train.py                        # 'small' and the bundled model's shape
    python benchmarks/bench_train.py --presets small,original --batch 64 --repeats 5

One step = what `elmo-fast train` runs per batch (elmo_fast.training.trainer.Trainer._step): the
biLM forward from zero states with bilm-tf's dropout 0.1, the sampled softmax of both directions
(--negative-samples unique log-uniform negatives), backward, global-norm clipping, Adagrad. A
batch is --batch sentences from benchmarks/corpus.py (log-normal lengths, mean ~25 tokens) with a
vocabulary of --vocab words (the corpus' words, then rare filler words); tokens/s counts the real tokens of the batch (targets of one
direction). "biLM only" runs the same step with the loss taken on the top layer's outputs instead
of the softmax, so 1 - biLM/step is the softmax's (and the optimizer's larger update's) share.
Medians of --repeats after one warm-up step; "busy" is the share of the CPUs other processes used
meanwhile (above ~5% the row was disturbed). Nothing asserts a speed.

*GFLOP/s* is tokens/s times a step's nominal FLOPs per token (TRAIN_FLOPS_FORMULA: three times the
forward's GEMM FLOPs, bench_cpu.py's formula plus the sampled softmax), and *% SGEMM* divides it
by the machine's fp32 GEMM rate (torch.matmul, 2048^3, the same threads) measured in the same run (the
higher of the rates at the start and at the end: other processes can only slow a GEMM down).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_cpu import flops_per_token, gemm_rate  # noqa: E402
from bench_lstm import timed, wait_quiet  # noqa: E402
from corpus import make_sentences  # noqa: E402

from elmo_fast.formats.bilm_tf import ElmoOptions  # noqa: E402
from elmo_fast.formats.random_models import PRESETS  # noqa: E402
from elmo_fast.formats.vocab import Vocabulary  # noqa: E402
from elmo_fast.training.data import sentence_batch  # noqa: E402
from elmo_fast.training.trainer import TrainConfig, Trainer  # noqa: E402

#: the bundled model's architecture
DEFAULT_OPTIONS = REPO / "elmo_fast" / "pretrained" / "default" / "options.json"


def shapes(name: str) -> dict:
    if name == "default":
        options = json.loads(DEFAULT_OPTIONS.read_text())
        return {k: options[k] for k in ("bidirectional", "char_cnn", "dropout", "lstm") if k in options}
    return PRESETS[name].to_dict()


TRAIN_FLOPS_FORMULA = (
    "training FLOPs/token = 3 x (the forward's, bench_cpu.py's FLOPS_FORMULA, + sampled softmax: 2 directions x "
    "2*P*negatives): a GEMM's forward, its input's gradient and its weight's gradient cost the same"
)


def train_flops_per_token(name: str, negatives: int) -> float:
    """Nominal FLOPs of one training step per token (TRAIN_FLOPS_FORMULA); None when the shapes are not
    a bilm-tf model's."""
    options = ElmoOptions.from_dict(shapes(name)) if name == "default" else PRESETS[name]
    softmax = 2 * 2 * options.projection_dim * negatives
    return 3 * (flops_per_token(options)["total"] + softmax)


def bench(name: str, backend: str, args, workdir: Path) -> dict:
    sentences = make_sentences(args.batch, seed=1)
    counts = Counter(t for s in sentences for t in s)
    words = [w for w, _ in counts.most_common(args.vocab - 3)]
    words += [f"<rare-{i}>" for i in range(args.vocab - 3 - len(words))]  # the softmax's full size
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", *words])
    vocab.save(workdir / "vocab.txt")
    (workdir / "train.txt").write_text("\n".join(" ".join(s) for s in sentences) + "\n")
    cfg = TrainConfig(
        train=[str(workdir / "train.txt")],
        heldout=[],
        vocab=str(workdir / "vocab.txt"),
        out=str(workdir / f"out-{name}-{backend}"),
        options=shapes(name),
        batch_size=args.batch,
        negative_samples=min(args.negative_samples, len(vocab) - 1),
        backend=backend,
        progress=False,
        seed=1,
        precision=args.precision,
    )
    trainer = Trainer(cfg)
    lm = trainer._build()
    lm.train()
    optimizer = torch.optim.Adagrad(lm.parameters(), lr=0.2, initial_accumulator_value=1.0, eps=0.0, fused=True)
    batch = sentence_batch(sentences, vocab)
    tokens = int((batch.fwd_targets >= 0).sum())
    step = [0]

    def full():
        trainer._step(lm, lm, optimizer, batch, step[0], None, [])
        step[0] += 1

    probe = torch.randn(args.batch, batch.fwd_targets.shape[1], shapes(name)["lstm"]["projection_dim"])

    def bilm_only():
        torch.manual_seed(step[0])
        fwd, bwd, _, _ = lm.top_outputs(batch)
        ((fwd * probe).sum() + (bwd * probe).sum()).backward()
        params = [p for p in lm.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step[0] += 1

    repeats = args.repeats if backend == "fast" else args.ref_repeats
    t_full, busy_full = timed(full, 1, repeats)
    t_bilm, busy_bilm = timed(bilm_only, 1, repeats)
    negatives = min(args.negative_samples, len(vocab) - 1)
    return {
        "model": name,
        "backend": lm.bilm.backend,
        "batch": args.batch,
        "tokens": tokens,
        "step_s": t_full,
        "tokens_per_s": tokens / t_full,
        "bilm_s": t_bilm,
        "softmax_share": max(0.0, 1.0 - t_bilm / t_full),
        "busy": max(busy_full, busy_bilm),
        "gflops": tokens / t_full * train_flops_per_token(name, negatives) / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="small,default", help="comma-separated: default, " + ", ".join(PRESETS))
    ap.add_argument("--batch", type=int, default=128, help="sentences per batch (elmo-fast train's default)")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size (capped by the corpus' words)")
    ap.add_argument("--negative-samples", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ref-repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--precision", default="fp32", help="the trainer's --precision (bf16: the forward under autocast)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.wait_quiet:
        wait_quiet(args.wait_quiet)
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    sgemm, sgemm_busy = gemm_rate(torch.float32, 2048, 5)
    print(
        f"# {cpu}, {os.cpu_count()} CPUs, {args.threads} threads, torch {torch.__version__}, precision "
        f"{args.precision}; SGEMM (2048^3) "
        f"{sgemm:.0f} GFLOP/s at the start (busy {100 * (sgemm_busy or 0):.0f}%)"
    )
    print(f"# {TRAIN_FLOPS_FORMULA}")
    print(
        "| model | backend | batch (tokens) | step s | tokens/s | biLM-only s | softmax+opt share | GFLOP/s "
        "| % SGEMM | busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.presets.split(","):
            for backend in ("fast",) + (() if args.no_reference else ("reference",)):
                r = bench(name, backend, args, Path(tmp))
                rows.append(r)
                print(
                    f"| {name} | {r['backend']} | {r['batch']} ({r['tokens']:,}) | {r['step_s']:.3f} | "
                    f"{r['tokens_per_s']:,.0f} | {r['bilm_s']:.3f} | {100 * r['softmax_share']:.0f}% | "
                    f"{r['gflops']:.0f} | {100 * r['gflops'] / sgemm:.0f}% | {100 * r['busy']:.0f}% |",
                    flush=True,
                )
            fast = [r for r in rows if r["model"] == name and r["backend"] == "fast"]
            ref = [r for r in rows if r["model"] == name and r["backend"] == "reference"]
            if fast and ref:
                print(
                    f"|  | fast / reference | | | {fast[0]['tokens_per_s'] / ref[0]['tokens_per_s']:.1f}x | | | | | |"
                )
    end, end_busy = gemm_rate(torch.float32, 2048, 5)
    best = max(sgemm, end)
    print(
        f"# SGEMM at the end {end:.0f} GFLOP/s (busy {100 * (end_busy or 0):.0f}%); % SGEMM above is of the start's; "
        f"of the higher, {best:.0f} GFLOP/s: "
        + ", ".join(f"{r['model']} {r['backend']} {100 * r['gflops'] / best:.0f}%" for r in rows)
    )
    for r in rows:
        r["sgemm_gflops"] = best
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
