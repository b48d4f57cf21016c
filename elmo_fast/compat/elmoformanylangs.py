"""ELMoForManyLangs' ``Embedder`` (HIT-SCIR's ``elmoformanylangs``), on the elmo-fast core.

    from elmo_fast.manylangs import Embedder   # was: from elmoformanylangs import Embedder
    e = Embedder("./hun")
    vectors = e.sents2elmo([["Szia", "!"], ["Jó", "reggelt", "."]], output_layer=-2)

The same model directories, the same arrays: ``sents2elmo`` returns one float32 numpy array per
sentence, in input order, of shape (T, 2P) for ``output_layer`` -1 (the mean of all layers, the
default) or k (layer k: 0 is the context-free token layer, [e ; e]), and (L + 1, T, 2P) for -2
(all layers); other negative values index from the end, as numpy does there.

One difference, on purpose: **every sentence starts from a zero LSTM state**. ELMoForManyLangs
sorts the sentences by length, cuts batches, shuffles the batches' order at random, and its
encoder carries the LSTM states from one batch to the next (row i of a batch starts where row i
of the batch before ended). So its vectors for a sentence depend on the sentences embedded
before it and on that random order: they change from run to run and with ``batch_size``. Here
they do not (beyond fp32 rounding, ~1e-6), and they equal what ELMoForManyLangs gives a sentence
embedded alone from a fresh state (its ``Embedder`` with the encoder's ``reset_states()`` before
each batch of one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from ..bilm.precision import Precision
from ..embedding.embedder import ElmoEmbedder
from ..errors import ElmoFastError
from ..sentences import as_batch


class Embedder:
    """``elmoformanylangs.Embedder(model_dir, batch_size=64)``, stateless and on the fast path.

    model_dir: an ELMoForManyLangs model directory (a bilm-tf one works too, with the same API;
    model_format, "elmoformanylangs" or "bilm-tf", picks one in a directory that holds both).
    batch_size: sentences per batch (sorted by length first, so batches carry little padding).
    device, backend, precision (or dtype, its older name), token_cache_mb: as
    :class:`~elmo_fast.ElmoEmbedder`'s (precision "fp32", "tf32", "bf16" or "fp16", each with its
    stated bound against fp32: :mod:`~elmo_fast.bilm.precision`).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        batch_size: int = 64,
        device: str | torch.device = "cpu",
        backend: str = "auto",
        dtype: torch.dtype | None = None,
        token_cache_mb: float = 256.0,
        *,
        precision: str | Precision | None = None,
        model_format: str | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.batch_size = batch_size
        self.embedder = ElmoEmbedder(
            model_dir=model_dir,
            device=device,
            batch_size=batch_size,
            backend=backend,
            dtype=dtype,
            precision=precision,
            token_cache_mb=token_cache_mb,
            model_format=model_format,
        )
        #: the biLM (an :class:`~elmo_fast.ElmoBiLm`)
        self.model = self.embedder.elmo_bilm

    @property
    def num_layers(self) -> int:
        """Output layers, the context-free one included (3 for the released models)."""
        return self.embedder.num_layers

    def _select(self, data: np.ndarray, output_layer: int) -> np.ndarray:
        if output_layer == -1:
            return data.mean(axis=0, dtype=np.float32)
        if output_layer == -2:
            return np.ascontiguousarray(data)  # a copy: not a view keeping its whole batch alive
        return np.ascontiguousarray(data[output_layer])

    def sents2elmo(self, sents: Sequence[Sequence[str]], output_layer: int = -1) -> list[np.ndarray]:
        """ELMo vectors of tokenized sentences: a list of float32 arrays, in input order (see the
        module docstring for ``output_layer``)."""
        layers = self.num_layers
        if (
            isinstance(output_layer, bool)
            or not isinstance(output_layer, (int, np.integer))
            or not -layers <= output_layer < layers
        ):
            raise ElmoFastError(
                f"output_layer must be -1 (the mean of the layers), -2 (all layers) or a layer in "
                f"0..{layers - 1} (or -{layers}..-3 from the end), got {output_layer!r}"
            )
        sents = as_batch(sents, "sents")
        # Longest first, in batches: vectors do not depend on batching, so sorting only saves padding.
        order = sorted(range(len(sents)), key=lambda i: -len(sents[i]))
        out: list[np.ndarray | None] = [None] * len(sents)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, data in zip(chunk, self.embedder.embed_batch([sents[i] for i in chunk])):
                out[i] = self._select(data, int(output_layer))
        return out  # type: ignore[return-value]
