"""``elmo-fast export onnx OUT.onnx``: the stateless biLM as one ONNX graph (the ``[onnx]`` extra)."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ElmoFastError
from .common import param_flags


def _run_onnx(args: argparse.Namespace) -> int:
    from .. import durable
    from ..export.contract import DEFAULT_OPSET
    from ..export.libraries import require
    from ..export.onnx_file import check_export_options, export_onnx
    from ..model_source import resolve_model
    from .serve import model_source  # the model flags as `serve` reads them (embed's, without torchrun)

    # the cheap refusals first: settings, the extra's libraries, the output; then the model
    check_export_options(args.opset if args.opset is not None else DEFAULT_OPSET, args.quantize)
    for library in ("onnx", "onnxruntime", "onnxscript"):
        require(library, "elmo-fast export onnx")
    final = durable.check_writable(args.output)
    if os.path.exists(final) and not args.overwrite:
        raise ElmoFastError(f"{args.output} exists: pass --overwrite to replace it")
    model, _ = model_source(args)  # ElmoEmbedder's model arguments (a named model fetched first)
    report = export_onnx(
        resolve_model(**model).weights,
        final,
        opset=args.opset if args.opset is not None else DEFAULT_OPSET,
        quantize=args.quantize,
    )
    print(
        f"elmo-fast: wrote {report.path} ({report.size_bytes / 2**20:.1f} MiB, opset {report.opset}, "
        f"{report.num_layers} layers x {report.dim}, quantization {report.quantization}) in {report.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


def add_parser(sub) -> None:
    from ..export.contract import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
    from ..pretrained import model_names

    p = sub.add_parser("export", help="write the biLM for another runtime (onnx)")
    formats = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    o = formats.add_parser(
        "onnx",
        help="the stateless biLM as one ONNX graph, dynamic batch and time (the [onnx] extra)",
        description="Write the model's stateless biLM as one ONNX graph: input char_ids (int64, [batch, "
        "time, 50], allennlp's character ids), outputs layers (float32, [batch, layers, time, dim], "
        "sentence boundaries removed) and mask (int64, [batch, time]). The file is checked by "
        "onnx.checker and loaded by ONNX Runtime before it is renamed into place. A bilm-tf model only; "
        "every batch starts from zero LSTM states (stateless).",
    )
    o.add_argument(
        "output", metavar="OUT.onnx", help="the ONNX file to write (written to a temporary name, renamed when complete)"
    )
    o.add_argument("--options", "--options-file", help="options.json of the model")
    o.add_argument("--weights", "--weight-file", help="weights.hdf5 of the model, bilm-tf layout")
    o.add_argument("--model-dir", metavar="DIR", help="a bilm-tf model directory (options.json + weights.hdf5)")
    o.add_argument(
        "--model-format",
        choices=["bilm-tf", "elmoformanylangs"],
        help="which model to load from a --model-dir that holds both kinds (only bilm-tf exports)",
    )
    o.add_argument(
        "--model",
        metavar="NAME",
        help=f"a model by name, as `serve` takes it: 'default' (bundled, offline; also used when no model is "
        f"given), an official one ({', '.join(model_names()[1:])}), hf:OWNER/REPO[@REVISION][/SUBFOLDER] (the "
        f"Hugging Face Hub; the [hub] extra), or URL#sha256=HEX; fetched once into the cache",
    )
    o.add_argument(
        "--opset",
        type=int,
        metavar="N",
        help=f"the ONNX opset, {MIN_OPSET} to {MAX_OPSET} (default {DEFAULT_OPSET}, torch's exporter's own; "
        f"others are converted from it)",
    )
    o.add_argument(
        "--quantize",
        choices=["int8", "int8-vnni"],
        help="ONNX Runtime's dynamic quantization of every matrix product (weights 8-bit per channel, "
        "activations per batch; the char CNN stays fp32): a smaller file, an error stated in docs/onnx.md. "
        "int8: its bound holds on every CPU; int8-vnni: faster on CPUs with VNNI (AVX512-VNNI, AVX-VNNI), "
        "its products saturate on x86 CPUs without",
    )
    o.add_argument("--overwrite", action="store_true", help="replace OUT.onnx if it exists (default: refuse)")
    o.set_defaults(func=_run_onnx, flags=param_flags(o), outcome=lambda args: f"no {args.output} was written")
