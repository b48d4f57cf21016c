"""``elmo-fast vocab``, ``train``, ``finetune`` and ``perplexity``: making biLMs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..durable import check_writable
from ..errors import InputError
from .common import add_max_line_length_flag, add_precision_flag, param_flags

#: the trainer's parameter names -> this parser's dests, so that errors raised by the library name flags
_API_NAMES = {"init_model_dir": "model_dir"}


def _vocab(args: argparse.Namespace) -> int:
    from ..training.data import expand_corpus
    from ..training.vocab import build_vocabulary

    files = expand_corpus(args.corpus, "corpus")
    check_writable(args.out, "vocabulary")  # before counting: a bad path fails now, not after the work
    if os.path.exists(args.out) and not args.overwrite:
        raise InputError(f"--out {args.out}: exists; pass --overwrite to replace it")
    vocab, stats = build_vocabulary(files, args.min_count, args.max_size, _tokenizer(args), args.max_line_length)
    vocab.save(args.out)
    print(
        f"wrote {args.out}: {len(vocab):,} tokens (<S>, </S>, <UNK> and the {len(vocab) - 3:,} most frequent words "
        f"seen >= {args.min_count} times) from {stats['sentences']:,} sentences, {stats['tokens']:,} tokens, "
        f"{stats['distinct']:,} distinct; they cover {100 * stats['coverage']:.2f}% of the tokens",
        file=sys.stderr,
    )
    return 0


def _tokenizer(args):
    if not getattr(args, "tokenize", False):
        return None
    from ..tokenizer import tokenize_line

    return tokenize_line


def _options(args: argparse.Namespace):
    from ..formats.bilm_tf import load_options
    from ..formats.random_models import PRESETS

    if args.preset and args.options:
        raise InputError("give --preset NAME or --options FILE, not both")
    if args.options:
        return load_options(args.options)
    if args.preset:
        return PRESETS[args.preset]
    raise InputError("give the architecture: --preset tiny|small|medium|original, or --options FILE")


def _run(args: argparse.Namespace, finetune: bool) -> int:
    from ..devices import resolve_device
    from ..distributed import distributed_setup, leave_group
    from ..formats.model_dir import model_dir_files
    from ..training.stop_signals import Interrupted
    from ..training.trainer import TrainConfig, Trainer

    device = distributed_setup(args.device)
    resolve_device(device)
    if finetune:
        _default_model_dir(args, announce=int(os.environ.get("RANK", "0")) == 0)
        options_file, _ = model_dir_files(args.model_dir)
        from ..formats.bilm_tf import load_options

        options = load_options(options_file)
        vocab = args.vocab or os.path.join(args.model_dir, "vocab.txt")
        if not os.path.exists(vocab):
            raise InputError(f"--model-dir {args.model_dir} holds no vocab.txt: give the vocabulary with --vocab FILE")
        has_softmax = os.path.exists(os.path.join(args.model_dir, "softmax.hdf5"))
        warmup = args.softmax_warmup if args.softmax_warmup is not None else (0 if has_softmax else 200)
    else:
        options = _options(args)
        vocab = args.vocab
        warmup = 0
    config = TrainConfig(
        train=args.train,
        heldout=args.heldout or [],
        vocab=vocab,
        out=args.out,
        options=options.to_dict(),
        epochs=args.epochs,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch,
        unroll_steps=args.unroll_steps,
        seed=args.seed,
        learning_rate=args.learning_rate,
        clip_norm=args.clip_norm,
        dropout=args.dropout,
        negative_samples=args.negative_samples,
        tokenize=args.tokenize,
        init_model_dir=os.path.abspath(args.model_dir) if finetune else None,
        softmax_warmup_steps=warmup,
        keep_best=finetune and bool(args.heldout),
        eval_every=args.eval_every,
        eval_max_sentences=args.eval_max_sentences,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
        device=str(device),
        backend=args.backend,
        precision=args.precision,
        progress=not args.quiet,
        max_line_length=args.max_line_length,
    )
    trainer = Trainer(config)
    if finetune and warmup and trainer.rank == 0:
        print(
            f"elmo-fast: {args.model_dir} has no softmax.hdf5: a new softmax starts from bilm-tf's initialisation "
            f"and trains alone for {warmup} steps (--softmax-warmup) before the biLM joins",
            file=sys.stderr,
        )
    start = time.perf_counter()
    try:
        result = trainer.run(resume=args.resume, overwrite=args.overwrite, allow_changed=args.allow_changed)
    except Interrupted as e:
        print(f"elmo-fast: {e.render(args.flags)}", file=sys.stderr)
        return 128 + e.signum
    leave_group()  # (after a failure the process exits at once and torchrun ends the other ranks)
    if trainer.rank == 0 and not args.quiet:
        best = f", best held-out perplexity {result['best']:.2f}" if result["best"] is not None else ""
        print(
            f"elmo-fast: trained {result['step']} steps, {result['tokens']:,} tokens in "
            f"{time.perf_counter() - start:.0f} s{best}; model in {args.out}",
            file=sys.stderr,
        )
    return 0


def _perplexity(args: argparse.Namespace) -> int:
    import torch

    from ..bilm.model import ElmoBiLm
    from ..devices import resolve_device
    from ..formats.bilm_tf import load_model_files, load_softmax
    from ..formats.model_dir import model_dir_files
    from ..formats.vocab import Vocabulary
    from ..training.data import expand_corpus
    from ..training.evaluate import evaluate
    from ..training.model import BidirectionalLM
    from ..training.softmax import SoftmaxHead

    files = expand_corpus(args.input, "input")
    _default_model_dir(args)
    options_file, weights_file = model_dir_files(args.model_dir)
    vocab = Vocabulary.load(args.vocab or os.path.join(args.model_dir, "vocab.txt"))
    weights = load_model_files(options_file, weights_file)
    w, b = load_softmax(os.path.join(args.model_dir, "softmax.hdf5"), len(vocab), weights.options.projection_dim)
    device = resolve_device(args.device)
    bilm = ElmoBiLm.from_weights(weights, backend=args.backend)
    lm = BidirectionalLM(bilm, SoftmaxHead(w, b, requires_grad=False)).to(device)
    with torch.inference_mode():
        result = evaluate(
            lm,
            files,
            vocab,
            batch_size=args.batch_size,
            device=device,
            tokenize=_tokenizer(args),
            max_line_length=args.max_line_length,
        )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"perplexity over {result['targets']:,} targets per direction: forward {result['forward']:.3f}, "
            f"backward {result['backward']:.3f}, mean {result['mean']:.3f}"
        )
    return 0


def _default_model_dir(args: argparse.Namespace, announce: bool = True) -> None:
    """--model-dir from --model NAME (any model --model takes, fetched once into the cache: the bundled
    one ships a softmax and a vocabulary, the official ones hold the biLM alone), or the bundled model
    when neither is given (said in one line)."""
    from ..pretrained import bundled_model, fetch, parse_model_spec
    from ..pretrained.bundled import USING_MESSAGE

    if args.model is not None:
        if args.model_dir is not None:
            raise InputError("give --model NAME or --model-dir DIR, not both")
        parse_model_spec(args.model)
        args.model_dir = str(fetch(args.model, progress=announce and not getattr(args, "quiet", False)).model_dir())
    elif args.model_dir is None and announce:
        print(USING_MESSAGE, file=sys.stderr)
    if args.model_dir is None:
        args.model_dir = str(bundled_model().directory)


def _common_training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--train",
        nargs="+",
        required=True,
        metavar="GLOB",
        help="training text: files or glob patterns, one whitespace-tokenized sentence per line "
        "(gzip/bzip2/xz read as they are)",
    )
    p.add_argument("--heldout", nargs="+", metavar="GLOB", help="held-out text, for perplexity during training")
    p.add_argument(
        "--out",
        required=True,
        help="output directory (model files, metrics.jsonl, checkpoints/); one run at a time: a second "
        "run on it fails at once naming the first one's PID",
    )
    p.add_argument("--epochs", type=int, default=10, help="passes over the training text (default 10)")
    p.add_argument("--max-steps", type=int, help="stop after N steps (batches) in all")
    p.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="sentences per batch (rows with --unroll-steps); per process under torchrun (default 128)",
    )
    p.add_argument(
        "--max-tokens-per-batch",
        type=int,
        metavar="N",
        help="at most N padded tokens per batch (sentence scheme; default: no limit)",
    )
    p.add_argument(
        "--unroll-steps",
        type=int,
        metavar="N",
        help="bilm-tf's scheme: rows of consecutive sentences in windows of N tokens, LSTM states carried "
        "from batch to batch (default: one sentence per row, from zero states)",
    )
    p.add_argument("--seed", type=int, default=0, help="data order, initialisation, dropout and sampling (default 0)")
    p.add_argument("--learning-rate", type=float, default=0.2, help="Adagrad's learning rate (bilm-tf: 0.2)")
    p.add_argument("--clip-norm", type=float, default=10.0, help="clip the global gradient norm (bilm-tf: 10.0)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout on LSTM inputs and outputs (bilm-tf: 0.1)")
    p.add_argument(
        "--negative-samples",
        type=int,
        default=8192,
        help="negatives of the sampled softmax per batch (bilm-tf's n_negative_samples_batch: 8192)",
    )
    p.add_argument("--tokenize", action="store_true", help="tokenize raw text with elmo-fast's tokenizer")
    p.add_argument("--eval-every", type=int, default=1000, help="held-out perplexity every N steps (default 1000)")
    p.add_argument("--eval-max-sentences", type=int, metavar="N", help="evaluate on the first N held-out sentences")
    p.add_argument("--checkpoint-every", type=int, default=500, help="checkpoint every N steps (default 500)")
    p.add_argument("--log-every", type=int, default=50, help="a metrics line every N steps (default 50)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (under torchrun: cuda uses cuda:LOCAL_RANK)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "fast", "reference"],
        help="fast (fused ops with backward passes) or reference (plain PyTorch autograd)",
    )
    add_precision_flag(p, training=True, deprecated_aliases=("--dtype",))
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest readable checkpoint; refused when the vocabulary, "
        "the corpus files or the settings differ from the ones it recorded",
    )
    p.add_argument(
        "--resume-anyway",
        dest="allow_changed",
        action="store_true",
        help="--resume even though the vocabulary, corpus or settings changed (the model then comes from "
        "two different runs; the architecture and vocabulary size must stay)",
    )
    p.add_argument("--overwrite", action="store_true", help="start over in an --out that holds a run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_max_line_length_flag(p)


def add_parsers(sub) -> None:
    from ..formats.random_models import PRESETS

    p = sub.add_parser(
        "vocab",
        help="build a biLM vocabulary (bilm-tf's vocab.txt) from corpora",
        description="Count tokens over the corpora and write bilm-tf's vocabulary file: <S>, </S>, "
        "<UNK>, then the words, most frequent first.",
    )
    p.add_argument("corpus", nargs="+", help="text files or glob patterns, one tokenized sentence per line")
    p.add_argument("--out", required=True, help="the vocabulary file to write")
    p.add_argument("--min-count", type=int, default=1, help="keep words seen at least N times (default 1)")
    p.add_argument("--max-size", type=int, help="at most N entries, special tokens included")
    p.add_argument("--tokenize", action="store_true", help="tokenize raw text with elmo-fast's tokenizer")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_max_line_length_flag(p)
    p.set_defaults(func=_vocab, flags=param_flags(p))

    p = sub.add_parser(
        "train",
        help="train a biLM from scratch (bilm-tf's recipe)",
        description="Train a biLM: char CNN, highway, projection, projected biLSTM, and a softmax shared "
        "by both directions, with sampled softmax, Adagrad and dropout as bilm-tf.",
    )
    _common_training_flags(p)
    p.add_argument("--vocab", required=True, help="vocabulary file (elmo-fast vocab)")
    p.add_argument("--preset", choices=list(PRESETS), help="architecture: " + ", ".join(PRESETS))
    p.add_argument("--options", help="architecture from an options.json instead of a preset")
    p.set_defaults(func=lambda a: _run(a, finetune=False), flags=param_flags(p))

    p = sub.add_parser(
        "finetune",
        help="continue training a biLM on new text (bilm-tf's restart.py)",
        description="Fine-tune the biLM of --model-dir on new text, keeping the model with the best "
        "held-out perplexity.",
    )
    _common_training_flags(p)
    p.add_argument(
        "--model-dir",
        help="the model to start from (options.json, weights.hdf5, and softmax.hdf5 + "
        "vocab.txt when it has them; default: the bundled model)",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="the model to start from, as embed's --model names it ('default', an official name, "
        "hf:OWNER/REPO[@REVISION][/SUBFOLDER], URL#sha256=HEX); one without vocab.txt needs --vocab",
    )
    p.add_argument("--vocab", help="vocabulary (default: the model directory's vocab.txt)")
    p.add_argument(
        "--softmax-warmup",
        type=int,
        metavar="N",
        help="steps training a new softmax alone first (default 200 without softmax.hdf5, else 0)",
    )
    p.set_defaults(func=lambda a: _run(a, finetune=True), flags=param_flags(p, _API_NAMES))

    p = sub.add_parser(
        "perplexity",
        help="perplexity of a biLM on held-out text",
        description="Forward, backward and mean perplexity over held-out text, sentence by sentence "
        "from zero states, with the full softmax.",
    )
    p.add_argument("input", nargs="+", help="text files or glob patterns, one tokenized sentence per line")
    p.add_argument(
        "--model-dir", help="options.json, weights.hdf5, softmax.hdf5 (and vocab.txt); default: the bundled model"
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="a model as embed's --model names it; it must hold softmax.hdf5 (the bundled 'default' does)",
    )
    p.add_argument("--vocab", help="vocabulary (default: the model directory's vocab.txt)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="auto", choices=["auto", "fast", "reference"])
    p.add_argument("--tokenize", action="store_true", help="tokenize raw text with elmo-fast's tokenizer")
    add_max_line_length_flag(p)
    p.add_argument(
        "--json", action="store_true", help='one line: {"forward": ..., "backward": ..., "mean": ..., "targets": N}'
    )
    p.set_defaults(func=_perplexity, flags=param_flags(p))
