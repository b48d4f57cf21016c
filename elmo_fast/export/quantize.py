"""``--quantize int8``: ONNX Runtime's dynamic int8 quantization of an exported graph.

What it quantizes, and why: every MatMul (the highway layers, the projection, each LSTM layer's input
gates, and inside the loop over time the recurrent and projection matrices), weights as int8 per
output channel, activations quantized on the fly per batch (``DynamicQuantizeLinear``), so no
calibration data is needed. The char CNN's convolutions stay fp32: ONNX Runtime's ``ConvInteger`` runs
slower than its fp32 convolution on a CPU, and adds error. The measured error is in docs/onnx.md;
tests/export/test_onnx_export.py holds it to its bound.
"""

from __future__ import annotations

import os

from .libraries import quiet, require

#: what --quantize takes, and what each is recorded as in the file's metadata
QUANTIZATIONS = {"int8": "int8-dynamic-matmul-per-channel"}


def quantize_int8(model, output: str | os.PathLike) -> None:
    """Write the int8 version of ``model`` (an ``onnx.ModelProto`` or a path) to ``output``."""
    quantization = require("onnxruntime.quantization", "--quantize int8")
    with quiet():
        quantization.quantize_dynamic(
            model,
            os.fspath(output),
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=quantization.QuantType.QInt8,
            extra_options={"EnableSubgraph": True},  # the loop over time is a subgraph: its MatMuls too
        )
