"""The ONNX graph's contract: what ``elmo-fast export onnx`` writes and ``--backend onnx`` runs.

========  =======  =========================  ====================================================
name      dtype    shape                      what
========  =======  =========================  ====================================================
char_ids  int64    [batch, time, 50]          allennlp's character ids (``batch_to_ids``), rows of
                                              zeros past each sentence's end
layers    float32  [batch, layers, time, dim]  the context-free layer (the token vector twice) and
                                              each biLSTM layer, sentence boundaries removed, zero
                                              past each sentence's end
mask      int64    [batch, time]              1 where a token is, 0 past each sentence's end
========  =======  =========================  ====================================================

``batch`` and ``time`` are dynamic; ``layers`` and ``dim`` are the model's. The check here reads the
inputs and outputs as plain data (name, element type, shape), as any runtime reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ElmoFastError

INPUT = "char_ids"
LAYERS = "layers"
MASK = "mask"
#: allennlp's character ids per token
TOKEN_WIDTH = 50

#: the opsets the export writes: torch's ONNX exporter translates to 18 and converts to the newer ones (17 would need
#: an opset-17 Split, which neither its translation nor onnx's version converter writes)
DEFAULT_OPSET = 18
MIN_OPSET = 18
MAX_OPSET = 23

#: metadata_props keys written into every exported file
META_CONTRACT = "elmo_fast.contract"
META_OPTIONS = "elmo_fast.options"
META_QUANTIZATION = "elmo_fast.quantization"
CONTRACT_VERSION = "1"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as a runtime reports it: element type ("int64", "float32", ...) and shape,
    each dimension an int (fixed), a str (named, dynamic) or None (dynamic, unnamed)."""

    name: str
    elem_type: str
    shape: tuple[int | str | None, ...]

    def __str__(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name} {self.elem_type} [{dims}]"


@dataclass(frozen=True)
class GraphShape:
    """What a graph that keeps the contract tells of its model: output layers and their width."""

    num_layers: int
    dim: int


EXPECTED = (
    "input char_ids int64 [batch, time, 50]; outputs layers float32 [batch, L, time, D], mask int64 [batch, time]"
)


def _dynamic(dim: int | str | None) -> bool:
    return not isinstance(dim, int) or dim < 0


def check_contract(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], source: str) -> GraphShape:
    """The model's shape if ``inputs`` and ``outputs`` keep the contract (module docstring), else a
    one-line :class:`ElmoFastError` naming ``source``, what it expects and what it found."""

    def refuse(why: str) -> ElmoFastError:
        found = "; ".join(
            [f"inputs {', '.join(map(str, inputs)) or 'none'}", f"outputs {', '.join(map(str, outputs)) or 'none'}"]
        )
        return ElmoFastError(f"{source}: not an elmo-fast ONNX graph ({why}): expected {EXPECTED}; found {found}")

    if [i.name for i in inputs] != [INPUT]:
        raise refuse("its inputs")
    if sorted(o.name for o in outputs) != sorted([LAYERS, MASK]):
        raise refuse("its outputs")
    char_ids = inputs[0]
    by_name = {o.name: o for o in outputs}
    layers, mask = by_name[LAYERS], by_name[MASK]
    if char_ids.elem_type != "int64" or len(char_ids.shape) != 3 or char_ids.shape[2] != TOKEN_WIDTH:
        raise refuse("char_ids")
    if not (_dynamic(char_ids.shape[0]) and _dynamic(char_ids.shape[1])):
        raise refuse("char_ids has a fixed batch or time")
    if (
        layers.elem_type != "float32"
        or len(layers.shape) != 4
        or _dynamic(layers.shape[1])
        or _dynamic(layers.shape[3])
    ):
        raise refuse("layers")
    if mask.elem_type != "int64" or len(mask.shape) != 2:
        raise refuse("mask")
    return GraphShape(num_layers=int(layers.shape[1]), dim=int(layers.shape[3]))
