"""GPU benchmark: the reference biLM vs the fast ops on CUDA, fp32 (TF32 off) / tf32 / bf16; and a
training step, fast vs reference.

    python benchmarks/bench_gpu.py [--preset original] [--batches 1,16,64,256] [--budget 1.5]
                                   [--train-batches 64]

Runs on a random-weight model of the preset's shapes (elmo_fast.formats.random_models) over realistic sentences
(benchmarks/corpus.py), every batch size with every config, for a time budget each:
  reference     elmo_fast.bilm.reference.bilm_ref on the GPU, fp32, TF32 off
  fast-fp32     the CUDA ops (char_cnn, highway, bilstm; layer-0 gates per distinct token), TF32 off
  fast-tf32     the same with TF32 GEMMs (torch.backends.cuda.matmul.allow_tf32 = True)
  fast-bf16     the same with bf16 weights (fp32 accumulation, fp32 cell state); if supported
  model-fp32    ElmoBiLm(backend="fast") on the GPU, char ids given on the CPU: the forward planned
                on the host (no device sync), stacked LSTM weights, TF32 off
  model-graphs  the same with cuda_graphs=8: each batch's bucket captured once, then replayed
  model-bf16    ElmoBiLm(dtype=torch.bfloat16), as model-fp32
The fast-* configs are the ops composed as a fast model composes them (fast_bilm below), so that
fp32, tf32 and bf16 run the same code whatever ElmoBiLm's backends are; model-* is the module users
call (its output's copy to the host not included).
Training (--train-batches, default 64; "" for none): one step of elmo_fast.training's
BidirectionalLM (the biLM with bilm-tf's dropout, a 100k-word softmax, 8192 sampled negatives,
both directions), forward + backward + Adagrad, in tokens/s (the targets of one direction):
  train-reference   the reference stages under autograd, fp32, TF32 off
  train-fast-fp32   the fast ops' forward and backward kernels (ops.HAS_CUDA_BACKWARD), TF32 off
  train-fast-tf32   the same with TF32 GEMMs
Latency p50/p90 from CUDA events around each batch, words/s (sentence tokens, boundaries not
counted) at p50, peak GPU memory, and achieved TFLOP/s (the model's matrix FLOPs: char CNN as a
convolution, highway, LSTM, over the valid positions) against a matmul measured here in that
precision. Every config's output is compared with the reference's (max abs difference). Prints
the machine, then a short table last; writes bench.json and bench.md into --out (default $OUT).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from corpus import make_sentences  # noqa: E402

from elmo_fast import batch_to_ids, load_options, load_weights
from elmo_fast.bilm import ops  # noqa: E402
from elmo_fast.bilm.reference import add_sentence_boundaries, bilm_ref, flat_lstm_weights, layer0_gates_ref  # noqa: E402
from elmo_fast.formats.random_models import random_model  # noqa: E402


def fast_bilm(char_ids, w):
    """bilm_ref's outputs through the CUDA ops (as a fast model does): char CNN and highway once
    per distinct token, layer-0 gates per distinct token, the biLSTM over token indices."""
    o = w.options
    ids, mask = add_sentence_boundaries(char_ids)
    B, T2, W = ids.shape
    uniq, inverse = torch.unique(ids.reshape(B * T2, W), dim=0, return_inverse=True)
    tokens = torch.ops.elmo_fast.char_cnn.default(
        uniq, w.char_embedding, list(w.conv_weights), list(w.conv_biases), o.activation
    )
    tokens = ops.highway(tokens, list(w.highway_weights), list(w.highway_biases), w.proj_weight, w.proj_bias)
    lstm = flat_lstm_weights(w.lstm)
    outputs, _, _ = torch.ops.elmo_fast.bilstm.default(
        layer0_gates_ref(tokens, lstm), inverse.view(B, T2), mask.sum(dim=1), lstm, o.cell_clip, o.proj_clip, None, None
    )
    token_vectors = tokens[inverse].view(B, T2, -1) * mask.unsqueeze(-1).to(tokens.dtype)
    return [torch.cat([token_vectors, token_vectors], dim=-1), *outputs.unbind(0)]


def model_flops(options, lengths) -> float:
    """Matrix FLOPs of the biLM over the valid positions (boundaries included), as the reference
    computes them: the char CNN as a convolution, highway + projection, every LSTM GEMM."""
    o = options
    W = o.max_characters_per_token
    F, P, C = o.n_filters, o.projection_dim, o.cell_dim
    cnn = sum(2 * o.char_dim * width * num * (W - width + 1) for width, num in o.filters)
    highway = o.n_highway * 2 * (2 * F) * F + 2 * F * P
    lstm = o.n_layers * 2 * 2 * (4 * C * P + 4 * C * P + P * C)
    positions = sum(n + 2 for n in lengths)
    return float(positions * (cnn + highway + lstm))


def time_it(fn, budget_s: float, min_iters: int = 3, max_iters: int = 50, warmup: int = 2):
    """Per-call latencies (s) from CUDA events, after `warmup` calls, for about `budget_s`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    start_wall = time.perf_counter()
    while len(events) < max_iters and (len(events) < min_iters or time.perf_counter() - start_wall < budget_s):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
        end.synchronize()  # the ops sync on the lengths anyway; keeps the wall budget honest
    return [s.elapsed_time(e) / 1e3 for s, e in events]


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def matmul_ceiling(dtype, allow_tf32: bool, n: int = 8192) -> float:
    """TFLOP/s of an n^3 matmul on random data in `dtype` (median of 10 after warm-up)."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    times = time_it(lambda: torch.mm(a, b), budget_s=0.5, min_iters=10, max_iters=10, warmup=3)
    return 2 * n**3 / percentile(times, 0.5) / 1e12


def max_diff(got, want) -> float:
    return max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))


def make_model_runner(options_file, weight_file, dev, **kwargs):
    """ElmoBiLm on the GPU, called with char ids on the CPU (the host-planned forward)."""
    from elmo_fast import ElmoBiLm

    bilm = ElmoBiLm(options_file, weight_file, backend="fast", **kwargs).to(dev).eval()

    def run(ids_cpu):
        with torch.inference_mode():
            return bilm(ids_cpu)["activations"]

    return run


def training_step_runner(options_file, weight_file, dev, backend, corpus, batch):
    """One training step of BidirectionalLM (see the module docstring) per call; returns (step,
    tokens per step). The batches rotate over the corpus."""
    from elmo_fast import ElmoBiLm
    from elmo_fast.formats.vocab import SPECIAL_TOKENS, Vocabulary
    from elmo_fast.training.data import sentence_batch
    from elmo_fast.training.model import BidirectionalLM
    from elmo_fast.training.softmax import SoftmaxHead

    words = sorted({w for s in corpus for w in s} - set(SPECIAL_TOKENS))
    vocab = Vocabulary([*SPECIAL_TOKENS, *words, *(f"w{i}" for i in range(100_000 - len(words) - 3))])
    bilm = ElmoBiLm(options_file, weight_file, backend=backend, requires_grad=True)
    lm = (
        BidirectionalLM(
            bilm,
            SoftmaxHead.initial(len(vocab), bilm.options.projection_dim, torch.Generator().manual_seed(0)),
            dropout=0.1,
            negative_samples=8192,
        )
        .to(dev)
        .train()
    )
    opt = torch.optim.Adagrad(lm.parameters(), lr=0.2, initial_accumulator_value=1.0)
    batches = []
    for i in range(4):
        b = sentence_batch(corpus[i * batch : (i + 1) * batch], vocab)
        batches.append(
            type(b)(
                *(
                    None if t is None else t.to(dev)
                    for t in (b.char_ids, b.lengths, b.fwd_targets, b.bwd_targets, b.bwd_char_ids)
                )
            )
        )
    tokens = sum(int((b.fwd_targets >= 0).sum()) for b in batches) / len(batches)
    gen = torch.Generator().manual_seed(1)
    counter = iter(range(10**9))

    def step():
        b = batches[next(counter) % len(batches)]
        f, bw, nf, nb, _, _ = lm(b, sample_generator=gen)
        loss = (f + bw) / (nf + nb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="original")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument(
        "--configs", default="reference,fast-fp32,fast-tf32,fast-bf16,model-fp32,model-graphs,model-bf16"
    )
    parser.add_argument("--train-batches", default="64", help="batch sizes of the training rows ('' for none)")
    parser.add_argument("--train-configs", default="train-reference,train-fast-fp32,train-fast-tf32")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds of timed calls per (config, batch)")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for bench.json / bench.md")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    fast_ok = ops.HAS_CUDA_KERNELS
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    machine = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cuda_kernels": fast_ok,
    }
    print("bench_gpu: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)

    bf16_ok = torch.cuda.is_bf16_supported()
    ceilings = {"fp32": matmul_ceiling(torch.float32, False), "tf32": matmul_ceiling(torch.float32, True)}
    if bf16_ok:
        ceilings["bf16"] = matmul_ceiling(torch.bfloat16, False)
    print(
        "bench_gpu: matmul ceilings (8192^3, TFLOP/s): " + ", ".join(f"{k} {v:.1f}" for k, v in ceilings.items()),
        flush=True,
    )

    tmp_dir = tempfile.TemporaryDirectory()
    options_file, weight_file = random_model(args.preset, tmp_dir.name, seed=0)
    w32 = load_weights(weight_file, load_options(options_file)).to(dev)
    wbf16 = w32.to(dtype=torch.bfloat16) if bf16_ok else None
    options = w32.options

    batches = [int(b) for b in args.batches.split(",")]
    configs = [c for c in args.configs.split(",") if c]
    corpus = make_sentences(4 * max(batches), seed=0)

    # Every runner takes a batch's char ids on the device and on the CPU: the fast-* and reference
    # configs read the former, the model-* ones the latter (the model plans on the host).
    def fast_fn(w):
        return lambda ids, ids_cpu: fast_bilm(ids, w)

    model_runners = {}

    def model_fn(name, **kwargs):
        def run(ids, ids_cpu):
            if name not in model_runners:  # made on first use: a config left out costs nothing
                model_runners[name] = make_model_runner(options_file, weight_file, dev, **kwargs)
            return model_runners[name](ids_cpu)

        return run

    runners = {
        "reference": (lambda ids, ids_cpu: bilm_ref(ids, w32)[0], False, "fp32"),
        "fast-fp32": (fast_fn(w32), False, "fp32"),
        "fast-tf32": (fast_fn(w32), True, "tf32"),
        "fast-bf16": (fast_fn(wbf16), False, "bf16"),
        "model-fp32": (model_fn("model-fp32"), False, "fp32"),
        "model-graphs": (model_fn("model-graphs", cuda_graphs=8), False, "fp32"),
        "model-bf16": (model_fn("model-bf16", dtype=torch.bfloat16), False, "bf16"),
    }
    rows = []
    interrupted = False
    try:  # SIGINT (gpu_check.sh's budget): the rows measured so far are still written
        for batch in batches:
            # a few different batches in rotation, as a real corpus would give
            groups = [corpus[i * batch : (i + 1) * batch] for i in range(4)]
            cpu_sets = [batch_to_ids(g) for g in groups]
            id_sets = [ids.to(dev) for ids in cpu_sets]
            lengths = [[len(s) for s in g] for g in groups]
            words = sum(sum(ls) for ls in lengths) / len(lengths)  # tokens per batch, boundaries not counted
            flops = sum(model_flops(options, ls) for ls in lengths) / len(lengths)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            reference_out = [t.float() for t in bilm_ref(id_sets[0], w32)[0]]
            ref_p50 = None
            for name in configs:
                fn, tf32, precision = runners[name]
                row = {"config": name, "batch": batch, "words": words, "gflop": flops / 1e9}
                if name.startswith(("fast", "model")) and not fast_ok:
                    row["skipped"] = "no CUDA kernels in elmo_fast._C"
                elif name == "fast-bf16" and not bf16_ok:
                    row["skipped"] = "bf16 not supported on this GPU"
                if "skipped" in row:
                    rows.append(row)
                    continue
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                try:
                    row["max_abs_diff_vs_reference"] = max_diff(fn(id_sets[0], cpu_sets[0]), reference_out)
                    counter = iter(range(10**9))
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    # model-graphs: each batch of the rotation seen once, then captured, before timing
                    times = time_it(
                        lambda: fn(*(lambda k: (id_sets[k], cpu_sets[k]))(next(counter) % len(id_sets))),
                        args.budget,
                        warmup=2 * len(id_sets) + 1 if name == "model-graphs" else 2,
                    )
                except Exception as e:  # keep going: one failing config must not hide the others
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    rows.append(row)
                    print(f"bench_gpu: {name} batch {batch}: {row['error']}", flush=True)
                    continue
                p50, p90 = percentile(times, 0.5), percentile(times, 0.9)
                row.update(
                    p50_ms=p50 * 1e3,
                    p90_ms=p90 * 1e3,
                    iters=len(times),
                    words_per_s=words / p50,
                    peak_gb=torch.cuda.max_memory_allocated() / 2**30,
                    tflops=flops / p50 / 1e12,
                    ceiling_tflops=ceilings[precision],
                )
                row["pct_of_ceiling"] = 100 * row["tflops"] / row["ceiling_tflops"]
                if name == "reference":
                    ref_p50 = p50
                if ref_p50 is not None:
                    row["speedup_vs_reference"] = ref_p50 / p50
                rows.append(row)
                print(
                    f"bench_gpu: {name:10s} batch {batch:4d}: p50 {row['p50_ms']:9.2f} ms, {row['words_per_s']:10.0f} "
                    f"words/s, diff {row['max_abs_diff_vs_reference']:.2e}",
                    flush=True,
                )
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

        model_runners.clear()  # the models go before the training rows take the memory
        train_batches = [int(b) for b in args.train_batches.split(",") if b]
        train_configs = [c for c in args.train_configs.split(",") if c]
        for batch in train_batches:
            ref_p50 = None
            for name in train_configs:
                row = {"config": name, "batch": batch}
                fast = name != "train-reference"
                if fast and not ops.HAS_CUDA_BACKWARD:
                    row["skipped"] = "no CUDA training kernels in elmo_fast._C (ops.HAS_CUDA_BACKWARD)"
                    rows.append(row)
                    continue
                tf32 = name.endswith("tf32")
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                try:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    step, tokens = training_step_runner(
                        options_file, weight_file, dev, "fast" if fast else "reference", corpus, batch
                    )
                    times = time_it(step, args.budget, min_iters=3, max_iters=20, warmup=2)
                except Exception as e:  # keep going: one failing config must not hide the others
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    rows.append(row)
                    print(f"bench_gpu: {name} batch {batch}: {row['error']}", flush=True)
                    continue
                finally:
                    step = None
                p50, p90 = percentile(times, 0.5), percentile(times, 0.9)
                row.update(
                    words=tokens,
                    p50_ms=p50 * 1e3,
                    p90_ms=p90 * 1e3,
                    iters=len(times),
                    words_per_s=tokens / p50,
                    peak_gb=torch.cuda.max_memory_allocated() / 2**30,
                )
                if name == "train-reference":
                    ref_p50 = p50
                if ref_p50 is not None:
                    row["speedup_vs_reference"] = ref_p50 / p50
                rows.append(row)
                print(
                    f"bench_gpu: {name:16s} batch {batch:4d}: p50 {row['p50_ms']:9.2f} ms, {row['words_per_s']:10.0f} "
                    "tokens/s (training step)",
                    flush=True,
                )
    except KeyboardInterrupt:
        interrupted = True
        print("bench_gpu: interrupted (SIGINT): the rows measured so far follow", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tmp_dir.cleanup()

    header = ("config", "batch", "words/s", "p50 ms", "p90 ms", "peak GB", "TFLOP/s", "% ceil", "x ref", "max|diff|")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if "p50_ms" not in r:
            lines.append(f"| {r['config']} | {r['batch']} | {r.get('skipped') or r.get('error')} |")
            continue
        if "tflops" not in r:  # a training row: tokens/s of a whole step
            lines.append(
                f"| {r['config']} | {r['batch']} | {r['words_per_s']:.0f} | {r['p50_ms']:.2f} | "
                f"{r['p90_ms']:.2f} | {r['peak_gb']:.2f} | | | {r.get('speedup_vs_reference', float('nan')):.1f} |"
                " |"
            )
            continue
        lines.append(
            f"| {r['config']} | {r['batch']} | {r['words_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['peak_gb']:.2f} | {r['tflops']:.1f} | {r['pct_of_ceiling']:.0f} | "
            f"{r.get('speedup_vs_reference', float('nan')):.1f} | {r['max_abs_diff_vs_reference']:.1e} |"
        )
    table = "\n".join(lines)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(
            json.dumps(
                {
                    "machine": machine,
                    "ceilings_tflops": ceilings,
                    "preset": args.preset,
                    "interrupted": interrupted,
                    "rows": rows,
                },
                indent=2,
            )
        )
        (out / "bench.md").write_text(
            f"# bench_gpu ({args.preset})\n\n{json.dumps(machine)}\n\nmatmul ceilings "
            f"(TFLOP/s): {json.dumps({k: round(v, 1) for k, v in ceilings.items()})}\n\n"
            f"{table}\n"
        )
    print(
        f"\nbench_gpu: {args.preset} on {props.name}, torch {torch.__version__}; ceilings (TFLOP/s) "
        + ", ".join(f"{k} {v:.0f}" for k, v in ceilings.items())
    )
    print(table, flush=True)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
