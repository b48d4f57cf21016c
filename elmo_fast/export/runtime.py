"""An exported graph opened in ONNX Runtime (CPU) and checked against the contract: what the export
checks its file with before renaming it into place, and what ``--backend onnx`` runs."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from ..errors import ElmoFastError
from .contract import META_QUANTIZATION, GraphShape, TensorSpec, check_contract
from .libraries import require
from .quantize import saturation_warning

#: ONNX Runtime's names of tensor types -> numpy's
_ELEM_TYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16"}


@dataclass(frozen=True)
class OnnxGraph:
    """A loaded graph: its ONNX Runtime session, the model's shape, the quantization it records."""

    path: str
    session: object  # onnxruntime.InferenceSession
    shape: GraphShape
    quantization: str


def _spec(arg) -> TensorSpec:
    elem = _ELEM_TYPES.get(arg.type, arg.type.removeprefix("tensor(").removesuffix(")"))
    return TensorSpec(arg.name, elem, tuple(arg.shape))


def open_session(path: str | os.PathLike, threads: int | None = None, warn: bool = True) -> OnnxGraph:
    """``path`` in ONNX Runtime on the CPU, its inputs and outputs checked against the contract; one
    line naming the file otherwise. threads: ONNX Runtime's intra-op threads (default: torch's
    ``get_num_threads()``, so that one setting, ``OMP_NUM_THREADS`` or ``torch.set_num_threads``,
    bounds both backends). warn: a RuntimeWarning where this CPU does not keep the graph's stated bound
    (:func:`~elmo_fast.export.quantize.saturation_warning`)."""
    ort = require("onnxruntime", "the onnx backend")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ElmoFastError(f"{path}: ONNX file not found")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: its notes on graph rewrites are not the user's concern
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (ONNX Runtime raises its own types for a bad file: said in one line)
        why = " ".join(str(e).split())
        raise ElmoFastError(f"{path}: ONNX Runtime cannot load it as a graph ({why[:300]})") from None
    shape = check_contract([_spec(a) for a in session.get_inputs()], [_spec(a) for a in session.get_outputs()], path)
    quantization = session.get_modelmeta().custom_metadata_map.get(META_QUANTIZATION, "none")
    if warn and (why := saturation_warning(path, quantization)) is not None:
        warnings.warn(why, RuntimeWarning, stacklevel=2)
    return OnnxGraph(path, session, shape, quantization)
