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
from dataclasses import dataclass

from .libraries import quiet, require

#: what --quantize takes, and what each is recorded as in the file's metadata
QUANTIZATIONS = {"int8": "int8-dynamic-matmul-per-channel"}


@dataclass(frozen=True)
class QuantizationBound:
    """The stated error of a quantized graph against its fp32 graph, over the tokens of a batch: per
    output layer, max |error| <= max_rel * the layer's max |value| and RMS error <= rms_rel * its RMS;
    per token, cosine(fp32 average of the layers, quantized average) >= min_cosine."""

    max_rel: float
    rms_rel: float
    min_cosine: float


#: measured (docs/onnx.md): random `small` / `original` weights on English-like sentences 3.9% / 2.6% /
#: 0.99971 at worst; the trained tiny bilm-tf model 1.5% / 1.0% / 0.99975; random weights whose cells and
#: projections hit their clips up to 8% / 4.7% / 0.9987. The bound leaves room over the worst of them;
#: tests/export/test_onnx_export.py holds every graph it makes to it.
INT8_BOUND = QuantizationBound(max_rel=0.12, rms_rel=0.07, min_cosine=0.995)


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
