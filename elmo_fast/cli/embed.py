"""``elmo-fast embed``: a file of sentences into allennlp's HDF5 layout.

It also takes ``allennlp elmo``'s command line (allennlp 0.9, the last with that command):
``--options-file``, ``--weight-file``, ``--cuda-device N``, ``--batch-size``,
``--use-sentence-keys``, ``--forget-sentences``, ``--file-friendly-logging``; ``--include-package``
and ``--vocab-path`` are accepted and ignored (allennlp's elmo command made no use of them either).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ElmoFastError, InputError
from .common import add_backend_flags, add_max_line_length_flag, add_precision_flag, onnx_file, param_flags

# the library's parameter names -> this parser's dests, so that errors raised by the library name flags
_API_NAMES = {
    "options_file": "options",
    "weight_file": "weights",
    "input_file": "input",
    "output_file_path": "output",
    "onnx_file": "onnx",
}


def _output_stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def outcome(args: argparse.Namespace) -> str:
    """What a run stopped by Ctrl-C or a signal leaves, for its last line."""
    from ..embedding.work_area import work_dir_of

    if not hasattr(args, "output_before"):  # stopped before it began
        return "no output was written"
    stamp = _output_stamp(args.output)
    if stamp is not None and stamp != args.output_before:
        return f"{args.output} was complete before it stopped"  # the signal came after the final rename
    if args.resume and os.path.isdir(work_dir_of(args.output)):
        return (
            f"completed windows are kept in {work_dir_of(args.output)}: run the same command (with --resume) "
            f"to continue"
        )
    return "no output was written"


def _device(args: argparse.Namespace) -> str | int:
    if args.cuda_device is None:
        return args.device or "cpu"
    if args.device is not None:
        raise ElmoFastError(
            f"give --device or --cuda-device, not both (got --device {args.device} and "
            f"--cuda-device {args.cuda_device})"
        )
    return args.cuda_device  # allennlp's: -1 the CPU, N >= 0 cuda:N


#: how long a rank waits for the others at the start and the end of a group's run (torch's default of
#: 30 minutes could cut off rank 0 checking a finished output against a large input)
GROUP_TIMEOUT_HOURS = 24


def _join_group(args: argparse.Namespace, device: str | int) -> str:
    """Under torchrun: refuse what one process must do, join the group (gloo: only small control
    messages travel), and pick this rank's device and threads."""
    import datetime

    from ..distributed import distributed_setup, world

    rank, world_size, _, _ = world()
    if args.stateful:
        raise ElmoFastError(
            f"--stateful cannot run under torchrun ({world_size} rank(s)): the LSTM states flow from "
            f"each batch to the next in input order, which needs one process; run `elmo-fast embed "
            f"--stateful` without torchrun"
        )
    if args.input == "-":
        raise ElmoFastError(
            "under torchrun every rank reads the input itself: give a file on a filesystem that every "
            "rank shares, not '-' (stdin)"
        )
    args.resume = True  # how ranks write, and how a restarted group continues
    device = "cpu" if device == -1 else ("cuda" if isinstance(device, int) else device)
    return distributed_setup(device, backend="gloo", timeout=datetime.timedelta(hours=GROUP_TIMEOUT_HOURS))


def run(args: argparse.Namespace) -> int:
    import contextlib

    from ..distributed import launched
    from ..embedding.output_checks import check_output_path
    from ..embedding.output_lock import hold_output

    # the cheap refusals come before loading (or downloading) a model
    check_output_path(args.output)  # the folder, the name's length: before the lock file is made beside it
    with contextlib.ExitStack() as held:
        if not launched():  # one run per output, from now (a group's rank 0 takes it as the group starts)
            held.enter_context(hold_output(args.output))
        return _run(args)


#: sentences per batch unless --batch-size says otherwise (allennlp's `allennlp elmo` default)
DEFAULT_BATCH_SIZE = 64


def _run(args: argparse.Namespace) -> int:
    from ..distributed import launched
    from ..embedding.embedder import ElmoEmbedder
    from ..embedding.output_checks import check_output

    args.output_before = _output_stamp(args.output)
    graph = onnx_file(args)  # an ONNX graph holds the model: then no model flag is given (checked)
    if args.model_dir:
        if args.model or args.options or args.weights:
            raise ElmoFastError("give one of --model-dir DIR, --model NAME or --options F --weights F")
    elif args.model:
        from ..pretrained import parse_model_spec

        if args.options or args.weights:
            raise ElmoFastError("give either --model NAME or --options F --weights F, not both")
        parse_model_spec(args.model)  # a bad name fails now, in one line, before anything is fetched
    elif bool(args.options) != bool(args.weights):
        raise ElmoFastError(
            "give --options F and --weights F together (or --model NAME, or --model-dir DIR, or "
            "none of them for the bundled model)"
        )
    elif not args.options and graph is None:  # no model named: the bundled one (`allennlp elmo` fetched the original)
        from ..pretrained.bundled import USING_MESSAGE, bundled_model

        args.model_dir = str(bundled_model().directory)
        if int(os.environ.get("RANK", 0)) == 0:  # one line under torchrun too
            print(USING_MESSAGE, file=sys.stderr)
    if args.stateful and args.max_tokens_per_batch is not None:
        raise ElmoFastError(
            "--max-tokens-per-batch cannot be used with --stateful: the LSTM states flow from each "
            "batch to the next in input order, so batches cannot be sorted by length; bound them "
            "with --batch-size"
        )
    device = _device(args)
    group = launched()
    if group:
        device = _join_group(args, device)
    if args.input != "-" and not os.path.exists(args.input):
        raise InputError(f"{args.input}: input file not found")
    check_output(args.output, args.overwrite, args.resume)
    if args.model_format and not args.model_dir:
        raise ElmoFastError(
            "--model-format picks the model of a --model-dir DIR that holds both kinds; give it with --model-dir"
        )
    if graph is not None:
        model = dict(onnx_file=graph)
    elif args.model_dir:
        model = dict(model_dir=args.model_dir, model_format=args.model_format)
    elif args.model:
        from ..pretrained import fetch

        if group:  # one download per machine: the first local rank fetches, the others then find it cached
            import torch.distributed as dist

            from ..distributed import world

            first = world()[2] == 0
            if first:
                local = fetch(args.model, progress=not args.quiet and world()[0] == 0)
            if dist.is_initialized():
                dist.barrier()
            if not first:
                local = fetch(args.model, progress=False)
        else:
            local = fetch(args.model, progress=not args.quiet)
        model = local.constructor_args()
    else:
        model = dict(options_file=args.options, weight_file=args.weights)
    embedder = ElmoEmbedder(
        **model,
        device=device,
        batch_size=args.batch_size if args.batch_size is not None else DEFAULT_BATCH_SIZE,
        stateful=args.stateful,
        backend=args.backend,
        precision=args.precision,
    )
    # stdin as bytes: lines are decoded one by one, so a line that is not UTF-8 can be named
    source = sys.stdin.buffer if args.input == "-" else args.input
    progress = False if args.quiet else ("log" if args.file_friendly_logging else True)
    embedder.embed_file(
        source,
        args.output,
        output_format=args.output_format,
        batch_size=args.batch_size,  # None: the embedder's (text), no bound on rows (--fasta: residues bound it)
        forget_sentences=args.forget_sentences,
        use_sentence_keys=args.use_sentence_keys,
        progress=progress,
        max_tokens_per_batch=args.max_tokens_per_batch,
        bucketing=not args.no_bucketing and not args.stateful,
        window=args.window,
        resume=args.resume,
        overwrite=args.overwrite,
        skip_empty=args.skip_empty,
        encoding_errors=args.encoding_errors,
        started=args.started,
        distributed=group,
        tokenize=args.tokenize,
        max_line_length=args.max_line_length,
        fasta=args.fasta,
        fasta_split_char=args.fasta_split_char,
        fasta_id_field=args.fasta_id_field,
        per_protein=args.per_protein,
        fasta_stop=args.fasta_stop,
        fasta_gaps=args.fasta_gaps,
    )
    return 0


def add_parser(sub) -> None:
    from ..embedding.options import DEFAULT_FASTA_MAX_TOKENS, DEFAULT_MAX_TOKENS, DEFAULT_WINDOW
    from ..pretrained import model_names

    p = sub.add_parser(
        "embed",
        help="embed a file of sentences into HDF5 (allennlp's `allennlp elmo` layout)",
        description="Embed one whitespace-tokenized sentence per line (raw text with --tokenize) into an "
        "HDF5 file: one "
        "float32 dataset per line, keyed by its index, plus 'sentence_to_index'. "
        "Takes `allennlp elmo`'s flags too.",
    )
    p.add_argument(
        "input",
        help="input text file, one sentence per line ('-' reads stdin), or a FASTA file with "
        "--fasta; gzip, bzip2 and xz files are decompressed, recognised by their content",
    )
    p.add_argument("output", help="output HDF5 file (written to a temporary name, renamed when complete)")
    fmt = p.add_mutually_exclusive_group(required=True)
    fmt.add_argument(
        "--all",
        action="store_const",
        const="all",
        dest="output_format",
        help="all layers per sentence: (3, T, D) for the usual 2-layer biLMs",
    )
    fmt.add_argument("--top", action="store_const", const="top", dest="output_format", help="the top layer: (T, D)")
    fmt.add_argument(
        "--average", action="store_const", const="average", dest="output_format", help="the mean of the layers: (T, D)"
    )
    fmt.add_argument(
        "--sum",
        action="store_const",
        const="sum",
        dest="output_format",
        help="the sum of the layers: (T, D) (SeqVec's per-residue default)",
    )
    fmt.add_argument(
        "--mean",
        action="store_const",
        const="mean",
        dest="output_format",
        help="one vector per sentence: the mean over its tokens of the layers' mean, (D,) (the server's and "
        "Ray's 'mean')",
    )
    p.add_argument("--options", "--options-file", help="options.json of the model (--options-file: allennlp's name)")
    p.add_argument(
        "--weights", "--weight-file", help="weights.hdf5 of the model, bilm-tf layout (--weight-file: allennlp's name)"
    )
    p.add_argument(
        "--model-dir",
        metavar="DIR",
        help="a model directory: bilm-tf's (options.json + weights.hdf5) or ELMoForManyLangs' (config.json, "
        "char.dic, word.dic, token_embedder.pkl, encoder.pkl)",
    )
    p.add_argument(
        "--model-format",
        choices=["bilm-tf", "elmoformanylangs"],
        help="which model to load from a --model-dir that holds both kinds (default: the one it holds; "
        "both is an error asking for this flag)",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help=f"a model by name: 'default' (bundled, offline; also used when no model is given), an "
        f"official one ({', '.join(model_names()[1:])}), hf:OWNER/REPO[@REVISION][/SUBFOLDER] (the Hugging "
        f"Face Hub; the [hub] extra), or URL#sha256=HEX (a folder holding options.json and weights.hdf5); "
        f"fetched once into the cache (elmo-fast models list)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help=f"at most N sentences per batch (default {DEFAULT_BATCH_SIZE}; with --fasta no bound: "
        f"--max-tokens-per-batch bounds it, as seqvec's --batchsize bounds its batches)",
    )
    p.add_argument(
        "--max-tokens-per-batch",
        type=int,
        metavar="N",
        help=f"at most N padded tokens (sentences x longest) per batch (stateless only; default "
        f"{DEFAULT_MAX_TOKENS}, and {DEFAULT_FASTA_MAX_TOKENS} residues with --fasta, seqvec's "
        f"--batchsize)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        metavar="N",
        help=f"sentences read ahead and sorted by length together; with --resume also the work saved "
        f"at once (default {DEFAULT_WINDOW})",
    )
    p.add_argument(
        "--no-bucketing",
        action="store_true",
        help="batch sentences in input order instead of by length (stateful mode always does)",
    )
    p.add_argument("--device", help="cpu or cuda[:N] (default cpu)")
    p.add_argument(
        "--cuda-device", type=int, metavar="N", help="allennlp's way to say the device: -1 the CPU, N >= 0 cuda:N"
    )
    add_backend_flags(p)
    add_precision_flag(p)
    p.add_argument(
        "--use-sentence-keys",
        action="store_true",
        help="key datasets by sentence text, not line index (then there is no sentence_to_index, as in allennlp)",
    )
    p.add_argument(
        "--forget-sentences",
        action="store_true",
        help="leave out the sentence_to_index map from each line's text to its key",
    )
    p.add_argument(
        "--stateful",
        action="store_true",
        help="carry LSTM states from batch to batch, as allennlp and bilm-tf do (default: stateless)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="work in OUTPUT.partial/, which survives crashes and kills; rerun with --resume to continue "
        "(implied under torchrun, where every rank embeds its share of the windows there); saved "
        "windows are checked against their completion records, and redone when they do not match. "
        "stdin or a pipe is read once, its lines checked against the saved windows as they pass",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists (default: refuse)")
    p.add_argument(
        "--tokenize",
        action="store_true",
        help="the input is raw text, one sentence per line: split off punctuation and clitics as the "
        "bundled model's training text was (elmo_fast.tokenizer); default: tokens are split at "
        "whitespace. Keys and sentence_to_index keep the lines as written",
    )
    p.add_argument(
        "--skip-empty",
        action="store_true",
        help="skip empty and all-whitespace lines (default: an error); the other lines keep their numbers",
    )
    add_max_line_length_flag(p)
    p.add_argument(
        "--encoding-errors",
        choices=["strict", "replace"],
        default="strict",
        help="a line that is not UTF-8: an error naming it (strict, default) or read with U+FFFD (replace)",
    )
    fasta = p.add_argument_group("proteins (FASTA)")
    fasta.add_argument(
        "--fasta",
        action="store_true",
        help="the input is FASTA (plain or compressed): one record a sequence, one residue a token "
        "(upper-cased; U, O, B, Z and X reach the model as themselves, as in SeqVec), each dataset named by "
        "the record's id (as seqvec and bio_embeddings)",
    )
    fasta.add_argument(
        "--split-char",
        dest="fasta_split_char",
        metavar="C",
        help="seqvec's id rule: the id is field --id of the header split at C (default: the header's "
        "first word, Biopython's record.id)",
    )
    fasta.add_argument(
        "--id",
        dest="fasta_id_field",
        type=int,
        default=1,
        metavar="N",
        help="with --split-char, the 0-based field holding the id (-1: the whole header; default 1)",
    )
    fasta.add_argument(
        "--per-protein",
        dest="per_protein",
        nargs="?",
        const="only",
        choices=["only", "also"],
        help="one vector per protein, the mean over its residues: instead of the residues' vectors "
        "(alone, or 'only'; seqvec's --protein), or beside them as each dataset's attribute "
        "'per_protein' ('also'). With --sum, bio_embeddings' reduce_per_protein",
    )
    fasta.add_argument(
        "--fasta-stop",
        choices=["drop", "keep", "refuse"],
        help="a stop '*' ending a record: dropped (drop, the default, as SeqVec's users strip it), kept as a "
        "character (keep: every '*', as seqvec's reader passes it) or an error (refuse); a '*' inside a "
        "sequence is an error unless keep",
    )
    fasta.add_argument(
        "--fasta-gaps",
        choices=["refuse", "remove"],
        help="alignment gaps '-' and '.': an error naming the record and position (refuse, the default) or "
        "removed (remove)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--file-friendly-logging",
        action="store_true",
        help="progress on a line of its own at most every 10 s, for log files (allennlp's flag)",
    )
    p.add_argument(
        "--include-package",
        action="append",
        metavar="PACKAGE",
        help="accepted for allennlp command lines, and ignored: elmo-fast loads no allennlp plugins",
    )
    p.add_argument("--vocab-path", help="accepted for allennlp command lines, and ignored (allennlp ignored it too)")
    p.set_defaults(func=run, outcome=outcome, flags=param_flags(p, _API_NAMES))
