"""What a caller asks of one sentence's activations, the one rule for ``embed``'s output formats and
the server's (and any front that serves them): "all", "top", "average", "sum" (SeqVec's per-residue
default), and the server's "mean"."""

from __future__ import annotations

import numpy as np


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
