"""``elmo-fast convert SRC OUT_DIR``: a bilm-tf training folder or a TF-Hub module, without TensorFlow."""

from __future__ import annotations

import argparse
import sys

from .common import param_flags


def _run(args: argparse.Namespace) -> int:
    from ..convert import convert

    convert(
        args.src,
        args.out_dir,
        step=args.step,
        cell_clip=args.cell_clip,
        proj_clip=args.proj_clip,
        activation=args.activation,
        vocab=args.vocab,
        overwrite=args.overwrite,
        log=lambda line: print(line, file=sys.stderr),
    )
    return 0


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: no clip), got {text}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a bilm-tf training folder or a TF-Hub ELMo module (no TensorFlow needed)",
        description="Read a TensorFlow checkpoint (a bilm-tf training folder: checkpoint, "
        "model.ckpt-N.index and .data-*, options.json; or a TF-Hub elmo module: "
        "saved_model.pb or tfhub_module.pb, variables/) and write OUT_DIR/options.json and "
        "weights.hdf5 in bilm-tf's layout, plus softmax.hdf5 and vocab.txt when the run has "
        "them, so that embed, allennlp and finetune take it.",
    )
    p.add_argument(
        "src", metavar="SRC", help="the bilm-tf save folder, the TF-Hub module folder, or a checkpoint prefix"
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="the model directory to write (created if missing)")
    p.add_argument(
        "--step",
        type=int,
        metavar="N",
        help="a bilm-tf run's checkpoint of step N (default: the latest, as the folder's checkpoint file names it)",
    )
    p.add_argument(
        "--cell-clip",
        type=_non_negative,
        metavar="C",
        help="the LSTM's cell clip (default: the source's options.json, else 3, the published models')",
    )
    p.add_argument(
        "--proj-clip",
        type=_non_negative,
        metavar="C",
        help="the LSTM's projection clip (default: the source's options.json, else 3)",
    )
    p.add_argument(
        "--activation",
        choices=["relu", "tanh"],
        help="the char CNN's activation (default: the source's options.json, else relu)",
    )
    p.add_argument(
        "--vocab",
        metavar="FILE",
        help="the run's vocabulary, written as OUT_DIR/vocab.txt beside the softmax (default: a vocab.txt in SRC)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier conversion in OUT_DIR")
    p.set_defaults(
        func=_run, flags=param_flags(p), outcome=lambda args: f"{args.out_dir} holds no half-converted model"
    )
