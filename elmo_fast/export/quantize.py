"""``--quantize int8`` and ``--quantize int8-vnni``: ONNX Runtime's dynamic int8 quantization of an
exported graph.

What it quantizes, and why: every MatMul (the highway layers, the projection, each LSTM layer's input
gates, and inside the loop over time the recurrent and projection matrices), weights 8-bit per
output channel, activations quantized on the fly per batch (``DynamicQuantizeLinear``), so no
calibration data is needed. The char CNN's convolutions stay fp32: ONNX Runtime's ``ConvInteger`` runs
slower than its fp32 convolution on a CPU, and adds error.

The two differ in the weights' type, which decides the kernels ONNX Runtime runs on an x86 CPU:

* ``int8``: unsigned 8-bit weights (u8u8 products). The stated bound holds on every CPU.
* ``int8-vnni``: signed 8-bit weights (u8s8), ONNX Runtime's fastest kernels on CPUs with VNNI
  (AVX512-VNNI or AVX-VNNI). On an x86 CPU without VNNI, ONNX Runtime sums pairs of u8 x s8 products in
  16 bits, which saturate: measured on an AVX2 CPU, errors of 17-34% of a layer's max where ``int8``
  gives 1.5-7.6%. :func:`saturation_warning` says so when such a graph is opened on such a CPU.

The measured errors are in docs/onnx.md; tests/export/test_onnx_export.py holds them to the bound.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

from .libraries import quiet, require
from .per_channel import vectorized_per_channel

#: what --quantize takes, and what each is recorded as in the file's metadata
QUANTIZATIONS = {"int8": "int8-dynamic-matmul-per-channel-u8u8", "int8-vnni": "int8-dynamic-matmul-per-channel-u8s8"}
#: the recorded quantizations whose bound needs VNNI on an x86 CPU
NEEDS_VNNI = frozenset({QUANTIZATIONS["int8-vnni"]})


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


def quantize_int8(model, output: str | os.PathLike, mode: str = "int8") -> None:
    """Write the ``mode`` ("int8" or "int8-vnni", see the module) version of ``model`` (an
    ``onnx.ModelProto`` or a path) to ``output``."""
    quantization = require("onnxruntime.quantization", f"--quantize {mode}")
    weight_type = {"int8": quantization.QuantType.QUInt8, "int8-vnni": quantization.QuantType.QInt8}[mode]
    with quiet(), vectorized_per_channel():  # ONNX Runtime's bytes, without its loop over channels
        quantization.quantize_dynamic(
            model,
            os.fspath(output),
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=weight_type,
            extra_options={"EnableSubgraph": True},  # the loop over time is a subgraph: its MatMuls too
        )


def cpu_has_vnni() -> bool:
    """Whether this CPU has the dot-product instructions ONNX Runtime's u8s8 kernels need to keep their
    sums exact (AVX512-VNNI or AVX-VNNI); True off x86, where the saturating AVX2 kernels do not run."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return bool({"avx512_vnni", "avx_vnni"} & set(value.split()))
    except OSError:
        pass
    probe = getattr(torch.cpu, "_is_vnni_supported", None)  # elsewhere: torch's probe (AVX512-VNNI)
    return bool(probe and probe())


def saturation_warning(path: str, quantization: str) -> str | None:
    """One line for a graph whose bound this CPU does not keep (``int8-vnni`` without VNNI), else None."""
    if quantization not in NEEDS_VNNI or cpu_has_vnni():
        return None
    return (
        f"{path}: quantized with --quantize int8-vnni (signed int8 weights), and this CPU has no VNNI: "
        f"ONNX Runtime's int8 products saturate here (measured on an AVX2 CPU: errors up to 34% of a layer's "
        f"max, where --quantize int8 stays within 8%); export with --quantize int8 for CPUs without VNNI"
    )
