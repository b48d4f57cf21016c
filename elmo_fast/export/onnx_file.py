"""``export_onnx``: a bilm-tf model's stateless biLM as one ONNX file, dynamic in batch and time.

The graph is the reference path traced by torch's ONNX exporter (``torch.onnx.export(dynamo=True)``:
torch.export, then onnxscript's translation), the loop over time a ``Scan`` (:mod:`.stateless_bilm`).
Its inputs and outputs are the contract of :mod:`.contract`; its ``metadata_props`` record the
contract's version, the model's options.json and the quantization. Before the file is renamed into
place, ``onnx.checker`` passes on it and ONNX Runtime loads it and finds the contract; any failure
leaves no file (:mod:`elmo_fast.durable`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

from .. import durable
from ..errors import ElmoFastError, Param
from ..formats.bilm_tf import ElmoWeights
from . import contract
from .libraries import quiet, require
from .quantize import QUANTIZATIONS, quantize_int8
from .runtime import open_session

#: protobuf's limit on one serialized message: an ONNX file that holds its weights inside is smaller
SINGLE_FILE_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export_onnx` wrote."""

    path: str
    seconds: float
    size_bytes: int
    opset: int
    quantization: str
    num_layers: int
    dim: int


def check_export_options(opset: int, quantize: str | None) -> None:
    """The export's settings, checked before any work (one line naming the parameter)."""
    if isinstance(opset, bool) or not isinstance(opset, int) or not contract.MIN_OPSET <= opset <= contract.MAX_OPSET:
        raise ElmoFastError(
            Param("opset"),
            f" must be an ONNX opset from {contract.MIN_OPSET} to {contract.MAX_OPSET} "
            f"(default {contract.DEFAULT_OPSET}), got {opset!r}",
        )
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ElmoFastError(
            Param("quantize"), f" must be one of {', '.join(QUANTIZATIONS)} (or none), got {quantize!r}"
        )


def exportable_weights(model) -> ElmoWeights:
    """The weights to export from an :class:`~elmo_fast.bilm.model.ElmoBiLm` (its current parameters) or
    an :class:`~elmo_fast.formats.bilm_tf.ElmoWeights`; a one-line error for what the graph cannot express."""
    from ..bilm.model import ElmoBiLm
    from ..formats.manylangs_dir import ManyLangsWeights

    if isinstance(model, ElmoBiLm):
        if model.stateful:
            raise ElmoFastError(
                "a stateful biLM carries its LSTM states from batch to batch, and the ONNX graph is "
                "stateless (every batch from zero states): export the model with stateful=False"
            )
        if model.precision.name != "fp32":
            raise ElmoFastError(
                f"the ONNX graph computes in fp32, and this biLM runs in {model.precision.name}: export it with "
                f"precision='fp32' (quantize='int8' gives a smaller, faster graph)"
            )
        model = model.weights()
    if isinstance(model, ManyLangsWeights):
        raise ElmoFastError(
            "an ELMoForManyLangs model cannot be exported to ONNX: the graph takes allennlp's character "
            "ids, and this model reads its own word and character dictionaries; export a bilm-tf model "
            "(options.json + weights.hdf5)"
        )
    if not isinstance(model, ElmoWeights):
        raise ElmoFastError(f"export_onnx takes an ElmoBiLm or ElmoWeights, got {type(model).__name__}")
    return model


def _example_ids() -> torch.Tensor:
    # two rows of different lengths: nothing in the trace may be specialised to one length or batch size
    from ..bilm.char_ids import batch_to_ids

    return batch_to_ids([["An", "example", "sentence", "."], ["Two", "more"]])


def _trace(weights: ElmoWeights, opset: int):
    """The fp32 graph as an ``onnx.ModelProto``."""
    from .stateless_bilm import StatelessBiLm

    require("onnxscript", "export to ONNX")
    module = StatelessBiLm(weights).eval()
    batch, time_ = torch.export.Dim("batch"), torch.export.Dim("time")
    with torch.no_grad(), quiet():
        program = torch.onnx.export(
            module,
            (_example_ids(),),
            dynamo=True,
            dynamic_shapes=({0: batch, 1: time_},),
            input_names=[contract.INPUT],
            output_names=[contract.LAYERS, contract.MASK],
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    proto = program.model_proto
    written = {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")}
    if written != {opset}:  # the exporter converts from its own opset, and could fall back to it
        raise ElmoFastError(
            Param("opset", opset),
            f" was asked, and torch's ONNX exporter wrote opset {sorted(written)}: "
            f"give {contract.DEFAULT_OPSET}, its own",
        )
    return proto


def _name_dims(proto, num_layers: int, dim: int) -> None:
    """The contract's dimension names on the graph's inputs and outputs (what runtimes show)."""
    shapes = {
        contract.INPUT: ("batch", "time", contract.TOKEN_WIDTH),
        contract.LAYERS: ("batch", num_layers, "time", dim),
        contract.MASK: ("batch", "time"),
    }
    for value in [*proto.graph.input, *proto.graph.output]:
        dims = value.type.tensor_type.shape.dim
        for d, want in zip(dims, shapes[value.name]):
            if isinstance(want, str):
                d.dim_param = want
            else:
                d.dim_value = want


def _stamp(proto, options_json: str, quantization: str) -> None:
    from .. import __version__

    entries = {
        contract.META_CONTRACT: contract.CONTRACT_VERSION,
        contract.META_OPTIONS: options_json,
        contract.META_QUANTIZATION: quantization,
    }
    kept = [p for p in proto.metadata_props if p.key not in entries]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in entries.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name, proto.producer_version = "elmo-fast", __version__


def export_onnx(
    model,
    path: str | os.PathLike,
    *,
    opset: int = contract.DEFAULT_OPSET,
    quantize: str | None = None,
) -> ExportReport:
    """Write ``model`` (an :class:`~elmo_fast.bilm.model.ElmoBiLm` or :class:`~elmo_fast.formats.bilm_tf.ElmoWeights`
    of a bilm-tf model) as one ONNX graph at ``path`` (see the module docstring and
    :mod:`~elmo_fast.export.contract`).

    opset: the ONNX opset, 18 to 23 (default 18, the exporter's own). quantize: None (fp32),
    "int8" or "int8-vnni" (:mod:`~elmo_fast.export.quantize`). Refused in one line, before any work: a stateful or
    low-precision ElmoBiLm, an ELMoForManyLangs model, an opset or quantization outside those; a
    graph over 2 GB (protobuf's limit on one file; the published ELMo models take at most ~360 MB).
    """
    check_export_options(opset, quantize)
    weights = exportable_weights(model)
    require("onnx", "export to ONNX")
    require("onnxruntime", "export to ONNX")
    final = durable.check_writable(path)
    started = time.perf_counter()
    o = weights.options
    num_layers, dim = o.n_layers + 1, 2 * o.projection_dim
    proto = _trace(weights, opset)
    _name_dims(proto, num_layers, dim)
    options_json = json.dumps(weights.options.to_dict(), sort_keys=True)
    return _write(proto, options_json, quantize, final, started, opset, num_layers, dim)


def quantize_onnx(
    source: str | os.PathLike,
    path: str | os.PathLike,
    quantize: str = "int8",
) -> ExportReport:
    """Write the ``quantize`` ("int8" or "int8-vnni", :mod:`~elmo_fast.export.quantize`) version of an fp32
    graph that :func:`export_onnx` wrote at ``source`` to ``path``: the same file as
    ``export_onnx(model, path, quantize=quantize)`` at the source's opset, without tracing the model again
    (tens of seconds for `original`: most of an export). Refused in one line: a file that is not an fp32 graph of this
    contract (another graph, or one already quantized)."""
    check_export_options(contract.DEFAULT_OPSET, quantize)
    if quantize is None:
        raise ElmoFastError(Param("quantize"), f" must be one of {', '.join(QUANTIZATIONS)}, got None")
    onnx = require("onnx", "quantize an ONNX graph")
    require("onnxruntime", "quantize an ONNX graph")
    final = durable.check_writable(path)
    started = time.perf_counter()
    try:
        proto = onnx.load(os.fspath(source))
    except Exception as e:  # noqa: BLE001  (a missing file, protobuf's DecodeError: said in one line)
        raise ElmoFastError(f"{source}: not an ONNX file elmo-fast can read ({type(e).__name__}: {e})") from e
    meta = {p.key: p.value for p in proto.metadata_props}
    if meta.get(contract.META_CONTRACT) != contract.CONTRACT_VERSION or contract.META_OPTIONS not in meta:
        raise ElmoFastError(
            f"{source}: not a graph elmo-fast exported (its metadata has no {contract.META_CONTRACT} "
            f"{contract.CONTRACT_VERSION!r}): quantize the fp32 graph `elmo-fast export onnx` wrote"
        )
    if meta.get(contract.META_QUANTIZATION) != "none":
        raise ElmoFastError(
            f"{source}: this graph is already quantized ({meta.get(contract.META_QUANTIZATION)}); "
            "quantize the fp32 graph"
        )
    (opset,) = {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")}
    layers = next(v for v in proto.graph.output if v.name == contract.LAYERS).type.tensor_type.shape.dim
    num_layers, dim = layers[1].dim_value, layers[3].dim_value
    return _write(proto, meta[contract.META_OPTIONS], quantize, final, started, opset, num_layers, dim)


def _write(proto, options_json: str, quantize, final: str, started: float, opset: int, num_layers: int, dim: int):
    """Quantize (unless None), stamp, check and durably write the fp32 graph ``proto``."""
    onnx = require("onnx", "export to ONNX")
    quantization = "none"
    if quantize is not None:
        with durable.scratch_dir() as scratch:
            quantized = os.path.join(scratch, "quantized.onnx")
            quantize_int8(proto, quantized, quantize)
            proto = onnx.load(quantized)
        quantization = QUANTIZATIONS[quantize]
    _stamp(proto, options_json, quantization)
    size = proto.ByteSize()
    if size > SINGLE_FILE_LIMIT:
        raise ElmoFastError(
            f"{final}: this model's graph takes {size / 2**30:.2f} GiB, and one ONNX file holds at most 2 GiB "
            f"(protobuf's limit); elmo-fast writes single-file graphs only"
        )
    onnx.checker.check_model(proto, full_check=True)
    with durable.durable_path(final, check=lambda temp: open_session(temp, threads=1, warn=False)) as temp:
        onnx.save_model(proto, temp)
    return ExportReport(
        path=final,
        seconds=time.perf_counter() - started,
        size_bytes=os.path.getsize(final),
        opset=opset,
        quantization=quantization,
        num_layers=num_layers,
        dim=dim,
    )
