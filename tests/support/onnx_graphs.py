"""ONNX graphs for the export room's and the onnx backend's tests: exported once per session (an export
traces the whole biLM: tens of seconds), the [onnx] extra's libraries or a skip naming it, random
sentences of chosen lengths, and the error measures of a quantized graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ONNX_LIBRARIES = ("onnx", "onnxruntime", "onnxscript")

#: characters the random tokens draw from: ASCII, Latin-1, CJK, an emoji (4 UTF-8 bytes), punctuation
_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789äöüßéñ東京日本語😀.,!?'-"


def require_onnx_extra() -> None:
    """Skip, naming the extra, unless its libraries import."""
    for name in ONNX_LIBRARIES:
        pytest.importorskip(name, reason=f'needs the [onnx] extra ({name} is missing): pip install "elmo-fast[onnx]"')


@pytest.fixture(scope="session")
def onnx_graphs(tmp_path_factory):
    """``get(options, weights, opset=18, quantize=None)`` -> the path of that model's exported graph,
    written once per session (a quantized graph from the fp32 one: the model is traced once)."""
    cache: dict = {}

    def get(options, weights, opset: int = 18, quantize: str | None = None):
        require_onnx_extra()
        from elmo_fast.export.onnx_file import export_onnx, quantize_onnx
        from elmo_fast.formats.bilm_tf import load_model_files

        key = (str(options), str(weights), opset, quantize)
        if key not in cache:
            path = tmp_path_factory.mktemp("onnx") / f"model-{opset}-{quantize or 'fp32'}.onnx"
            if quantize is None:
                export_onnx(load_model_files(options, weights), path, opset=opset)
            else:  # the fp32 graph quantized (tests/export/test_onnx_export.py: the same file as an export's)
                quantize_onnx(get(options, weights, opset), path, quantize)
            cache[key] = path
        return cache[key]

    return get


def random_token(rng: np.random.Generator) -> str:
    # mostly short words; now and then one longer than the 48 bytes a token keeps
    n = int(rng.integers(1, 12)) if rng.random() < 0.9 else int(rng.integers(40, 70))
    return "".join(_CHARS[i] for i in rng.integers(0, len(_CHARS), n))


def random_batch(rng: np.random.Generator, lengths) -> list[list[str]]:
    """One sentence of random tokens per length in ``lengths`` (0: an empty sentence)."""
    return [[random_token(rng) for _ in range(int(n))] for n in lengths]


def quantization_error(fp32: torch.Tensor, int8: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The errors docs/onnx.md states for --quantize int8, over the tokens (mask) of a batch's layers
    [B, L, T, D]: the worst layer's max |error| relative to its max |value|, its RMS error relative to
    its RMS, and the least cosine between a token's fp32 and int8 averages of the layers."""
    keep = mask.bool()
    max_rel, rms_rel = 0.0, 0.0
    for k in range(fp32.shape[1]):
        a, b = fp32[:, k][keep], int8[:, k][keep]
        max_rel = max(max_rel, ((b - a).abs().max() / a.abs().max()).item())
        rms_rel = max(rms_rel, ((b - a).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()).item())
    cosine = torch.nn.functional.cosine_similarity(fp32.mean(dim=1)[keep], int8.mean(dim=1)[keep], dim=-1)
    return {"max_rel": max_rel, "rms_rel": rms_rel, "min_cosine": cosine.min().item()}
