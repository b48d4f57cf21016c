"""What a caller asks of one sentence's activations, the one rule for every front's outputs: ``embed``'s
flags (``--all``, ``--top``, ``--average``, ``--sum``, ``--mean``) and ``embed_file``'s ``output_format``,
the server's ``"output"``, Ray's ``output``: "all", "top", "average", "sum" (SeqVec's per-residue
default) and "mean" (one vector per sentence). Each front accepts all of :data:`OUTPUTS`, and refuses
anything else with :func:`unknown_output`'s words."""

from __future__ import annotations

import numpy as np

#: every output a front accepts, in the order messages list them
OUTPUTS = ("all", "top", "average", "sum", "mean")


def unknown_output(output: object) -> str:
    """What every front says of an output that is not one of :data:`OUTPUTS` (after the name of its
    parameter: ``output_format``, ``--output``'s field ``'output'``, ...)."""
    return f"must be one of {', '.join(map(repr, OUTPUTS))}, got {output!r}"


def shape_output(activations: np.ndarray, output: str) -> np.ndarray:
    """One sentence's [L + 1, T, D] activations -> what ``output`` asks for, C-contiguous float32:
    "all" [L + 1, T, D], "average" [T, D] (the mean of the layers), "sum" [T, D] (their sum), "top" [T, D],
    "mean" [D] (the mean over tokens of the layer average)."""
    if output == "all":
        out = activations
    elif output == "top":
        out = activations[-1]
    elif output == "sum":
        out = activations.sum(axis=0)
    else:
        out = activations.mean(axis=0)
        if output == "mean":
            out = out.mean(axis=0)
    return np.ascontiguousarray(out, dtype=np.float32)
