"""``backend="onnx"``: an exported graph (``elmo-fast export onnx``) in ONNX Runtime, in the place of
:class:`~elmo_fast.bilm.model.ElmoBiLm`'s forward. :class:`OnnxBiLm` offers what the embedder and the
corpus pipeline ask of a biLM (``batch_to_ids``, ``embed``, ``num_layers``, ``get_output_dim``,
``stateful``, ``backend``, ``compute_dtype``), so tokenization, batching, output layouts, resume
and the server's batching stay the same code."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import Tensor

from ..bilm.char_ids import AllenNlpCharIds
from ..errors import ElmoFastError, Param
from ..export.contract import INPUT, LAYERS, MASK
from ..export.runtime import open_session

#: the backends an embedder takes: the biLM's own (bilm/backends.py), and an exported graph
ONNX = "onnx"


class OnnxBiLm:
    """The graph at ``path`` (checked against :mod:`elmo_fast.export.contract` on load), run on the CPU.

    Stateless, fp32 (or the int8 of a graph exported with ``--quantize int8``: :attr:`quantization`);
    allennlp's character ids as the input, so bilm-tf models only (what the export takes)."""

    backend = ONNX
    stateful = False
    #: what the output layers are computed in (an int8 graph's weights are int8, its outputs fp32)
    compute_dtype = torch.float32

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        graph = open_session(path, threads)
        self.path = graph.path
        self.session = graph.session
        self.quantization = graph.quantization
        #: what the graph computes in, as the server's /info names a biLM's precision
        self.precision = "fp32" if graph.quantization == "none" else "int8"
        self.num_layers = graph.shape.num_layers
        self._dim = graph.shape.dim
        self.front_end = AllenNlpCharIds()

    def get_output_dim(self) -> int:
        return self._dim

    def batch_to_ids(self, sentences: Sequence[Sequence[str]]) -> Tensor:
        return self.front_end.batch_to_ids(sentences)

    def embed(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """layers [B, L + 1, T, D] and mask [B, T] (bool) for char ids [B, T, 50], as ElmoBiLm.embed."""
        if char_ids.shape[0] == 0:
            return torch.zeros(0, self.num_layers, char_ids.shape[1], self._dim), torch.zeros(
                0, char_ids.shape[1], dtype=torch.bool
            )
        layers, mask = self.session.run([LAYERS, MASK], {INPUT: char_ids.numpy()})
        return torch.from_numpy(layers), torch.from_numpy(mask).bool()

    def __repr__(self) -> str:
        return f"OnnxBiLm({self.path!r}, quantization={self.quantization!r})"


def check_onnx_settings(
    onnx_file, model_given: bool, device: torch.device, stateful: bool, precision_name: str
) -> None:
    """What backend="onnx" refuses, each in one line before anything loads."""
    if onnx_file is None:
        raise ElmoFastError(
            Param("backend", ONNX), " needs ", Param("onnx_file"), " (a graph written by `elmo-fast export onnx`)"
        )
    if model_given:
        raise ElmoFastError(
            "the ONNX file holds the model: give ",
            Param("onnx_file"),
            " alone, without model files or a model directory",
        )
    if device.type != "cpu":
        raise ElmoFastError(Param("backend", ONNX), f" runs on the CPU (ONNX Runtime's CPU provider), not {device}")
    if stateful:
        raise ElmoFastError(
            "the ONNX graph is stateless (every batch from zero states): ",
            Param("stateful"),
            " needs the fast or reference backend",
        )
    if precision_name != "fp32":
        raise ElmoFastError(
            Param("precision", precision_name),
            " is the fast path's arithmetic; an ONNX graph computes as it was exported (fp32, or int8 with "
            "`elmo-fast export onnx --quantize int8`)",
        )
