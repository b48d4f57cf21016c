#!/usr/bin/env python
"""Training with the fast ops' backward passes vs the fast inference forward vs reference autograd.

    python benchmarks/bench_train_ops.py                         # 'small' and 'original', batch 64
    python benchmarks/bench_train_ops.py --preset small --repeats 7 --breakdown

One batch of --batch sentences from benchmarks/corpus.py (log-normal lengths, mean ~25 tokens, plus
<S> and </S>), a random-weight model of the preset's shapes (elmo_fast.formats.random_models), --threads threads.
Every stage runs on the same N real tokens (padding excluded; no deduplication of repeated tokens,
which the inference path would otherwise do), three ways:
  infer  the fast inference forward under inference_mode: char_cnn, highway, then layer 0's input
         gates (one GEMM) and the bilstm op;
  train  forward + backward with the fast ops under autograd, every weight requiring grad:
         char_cnn and highway (their backward kernels), ops.bilstm_train with bilm-tf's dropout 0.1
         (and 'train p=0' without), loss = sum(outputs * fixed random tensor);
  ref    the reference stages under autograd, as ElmoBiLm fine-tunes today: char_cnn_ref,
         highway_ref, layer0_gates_ref + bilstm_ref, forward + backward of the same loss.
Rows: the LSTM stack, char_cnn, highway, and the whole biLM end to end (softmax excluded). Ratios:
train / infer (target <= 3.5) and ref / train (target >= 5). Medians of --repeats after one warm-up
("busy": the share of the machine's CPUs other processes used meanwhile; above ~5% the row was
disturbed). Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_lstm import timed, wait_quiet  # noqa: E402
from corpus import make_sentences  # noqa: E402

from elmo_fast import batch_to_ids, load_options, load_weights  # noqa: E402
from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.bilm.reference import (  # noqa: E402
    add_sentence_boundaries,
    bilstm_ref,
    char_cnn_ref,
    flat_lstm_weights,
    highway_ref,
    layer0_gates_ref,
)
from elmo_fast.formats.random_models import random_model  # noqa: E402


class Batch:
    """The batch's token ids and the model's weights, as leaves that require grad."""

    def __init__(self, preset: str, batch: int, seed: int, workdir: Path):
        options_file, weight_file = random_model(preset, workdir, seed=seed, exercise_clips=True)
        w = load_weights(weight_file, load_options(options_file))
        self.options = w.options
        ids, mask = add_sentence_boundaries(batch_to_ids(make_sentences(batch, seed=seed)))
        self.B, self.T = mask.shape
        self.lengths = mask.sum(dim=1)
        self.mask = mask
        self.ids = ids[mask]  # [N, 50] the real tokens
        self.N = self.ids.shape[0]
        self.token_index = torch.zeros(self.B, self.T, dtype=torch.long)
        self.token_index[mask] = torch.arange(self.N)
        leaf = lambda t: t.detach().clone().requires_grad_()  # noqa: E731
        self.emb = leaf(w.char_embedding)
        self.conv_w = [leaf(t) for t in w.conv_weights]
        self.conv_b = [leaf(t) for t in w.conv_biases]
        self.hw_w = [leaf(t) for t in w.highway_weights]
        self.hw_b = [leaf(t) for t in w.highway_biases]
        self.proj_w, self.proj_b = leaf(w.proj_weight), leaf(w.proj_bias)
        self.lstm = [leaf(t) for t in flat_lstm_weights(w.lstm)]
        P = self.proj_w.shape[0]
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randn(self.N, P, generator=gen)  # the LSTM rows' input, standalone
        self.x = torch.zeros(self.B, self.T, P)
        self.x[mask] = self.tokens
        L = self.options.n_layers
        self.out_weight = torch.randn(L, self.B, self.T, 2 * P, generator=gen)
        self.cnn_weight = torch.randn(self.N, self.options.n_filters, generator=gen)
        self.hw_weight = torch.randn(self.N, P, generator=gen)

    def params(self) -> list[torch.Tensor]:
        return [self.emb, *self.conv_w, *self.conv_b, *self.hw_w, *self.hw_b, self.proj_w, self.proj_b, *self.lstm]

    def clear(self) -> None:
        for p in self.params():
            p.grad = None


def stage_fns(b: Batch, dropout: float) -> dict[str, dict[str, callable]]:
    o = b.options
    act = o.activation
    clips = (o.cell_clip, o.proj_clip)
    L = o.n_layers
    P = b.proj_w.shape[0]

    def grads(loss):
        loss.backward()
        b.clear()

    def lstm_infer():
        with torch.inference_mode():
            xg0 = layer0_gates_ref(b.tokens, b.lstm)
            ops.bilstm(xg0, b.token_index, b.lengths, b.lstm, *clips)

    def lstm_train(p):
        out, _, _ = ops.bilstm_train(b.x, b.lengths, b.lstm, *clips, dropout=p, training=True)
        grads((out * b.out_weight).sum())

    def lstm_ref():
        xg0 = layer0_gates_ref(b.tokens, b.lstm)
        out, _, _ = bilstm_ref(xg0, b.token_index, b.lengths, b.lstm, *clips)
        grads((out * b.out_weight).sum())

    def cnn_infer():
        with torch.inference_mode():
            ops.char_cnn(b.ids, b.emb, b.conv_w, b.conv_b, act)

    def cnn_train():
        grads((ops.char_cnn(b.ids, b.emb, b.conv_w, b.conv_b, act) * b.cnn_weight).sum())

    def cnn_ref():
        grads((char_cnn_ref(b.ids, b.emb, b.conv_w, b.conv_b, act) * b.cnn_weight).sum())

    cnn_out = ops.char_cnn(b.ids, b.emb, b.conv_w, b.conv_b, act).detach()

    def hw_infer():
        with torch.inference_mode():
            ops.highway(cnn_out, b.hw_w, b.hw_b, b.proj_w, b.proj_b)

    def hw_train():
        grads((ops.highway(cnn_out, b.hw_w, b.hw_b, b.proj_w, b.proj_b) * b.hw_weight).sum())

    def hw_ref():
        grads((highway_ref(cnn_out, b.hw_w, b.hw_b, b.proj_w, b.proj_b) * b.hw_weight).sum())

    def bilm_infer():
        with torch.inference_mode():
            tokens = ops.highway(
                ops.char_cnn(b.ids, b.emb, b.conv_w, b.conv_b, act), b.hw_w, b.hw_b, b.proj_w, b.proj_b
            )
            ops.bilstm(layer0_gates_ref(tokens, b.lstm), b.token_index, b.lengths, b.lstm, *clips)

    def bilm_train(p):
        tokens = ops.highway(ops.char_cnn(b.ids, b.emb, b.conv_w, b.conv_b, act), b.hw_w, b.hw_b, b.proj_w, b.proj_b)
        x = tokens.new_zeros(b.B, b.T, P).index_put((b.mask,), tokens)
        out, _, _ = ops.bilstm_train(x, b.lengths, b.lstm, *clips, dropout=p, training=True)
        grads((out * b.out_weight).sum())

    def bilm_ref():
        tokens = highway_ref(char_cnn_ref(b.ids, b.emb, b.conv_w, b.conv_b, act), b.hw_w, b.hw_b, b.proj_w, b.proj_b)
        out, _, _ = bilstm_ref(layer0_gates_ref(tokens, b.lstm), b.token_index, b.lengths, b.lstm, *clips)
        grads((out * b.out_weight).sum())

    assert L == len(b.lstm) // 8
    return {
        "LSTM stack": {
            "infer": lstm_infer,
            "train": lambda: lstm_train(dropout),
            "train p=0": lambda: lstm_train(0.0),
            "ref": lstm_ref,
        },
        "char_cnn": {"infer": cnn_infer, "train": cnn_train, "ref": cnn_ref},
        "highway": {"infer": hw_infer, "train": hw_train, "ref": hw_ref},
        "whole biLM": {"infer": bilm_infer, "train": lambda: bilm_train(dropout), "ref": bilm_ref},
    }


def breakdown(fn, what: str) -> None:
    """Self CPU time per op of one call, directions in turn so that every GEMM runs on the profiled thread."""
    from torch.profiler import ProfilerActivity, profile

    os.environ["ELMO_FAST_BILSTM_THREADS"] = "sequential"
    try:
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        os.environ.pop("ELMO_FAST_BILSTM_THREADS", None)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"  breakdown of {what} (directions in turn), self CPU time {total / 1e3:.0f} ms:")
    for e in events[:14]:
        print(f"    {e.key:42s} {e.self_cpu_time_total / 1e3:9.1f} ms {e.self_cpu_time_total / total:6.1%}  x{e.count}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small,original", help="comma-separated presets")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ref-repeats", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--stages", default="LSTM stack,char_cnn,highway,whole biLM")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="profile one training step of the LSTM stack and the biLM")
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
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; batch {args.batch}, dropout {args.dropout}"
    )
    stages = args.stages.split(",")
    for preset in args.preset.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            b = Batch(preset, args.batch, seed=0, workdir=Path(tmp))
        o = b.options
        print(
            f"\n{preset}: P={o.projection_dim} C={o.cell_dim} L={o.n_layers}, {len(o.filters)} convolutions "
            f"({o.n_filters} filters), {o.n_highway} highway; B={b.B} T={b.T} (with <S> </S>), "
            f"N={b.N} tokens ({b.N / (b.B * b.T):.0%} of B*T)"
        )
        fns = stage_fns(b, args.dropout)
        for stage in stages:
            rows = {}
            for kind, fn in fns[stage].items():
                if kind == "ref" and args.no_reference:
                    continue
                if args.wait_quiet:
                    wait_quiet(args.wait_quiet)
                repeats = args.ref_repeats if kind == "ref" else args.repeats
                rows[kind] = timed(fn, 1, repeats)
            line = "  ".join(f"{k} {t * 1e3:8.1f} ms (busy {busy:.0%})" for k, (t, busy) in rows.items())
            ratios = f"train/infer {rows['train'][0] / rows['infer'][0]:.2f}"
            if "ref" in rows:
                ratios += f", ref/train {rows['ref'][0] / rows['train'][0]:.1f}"
            print(f"  {stage:11s} {line}  | {ratios}")
        if args.breakdown:
            breakdown(fns["LSTM stack"]["train"], "the LSTM stack's training step")
            breakdown(fns["whole biLM"]["train"], "the whole biLM's training step")


if __name__ == "__main__":
    main()
