"""bio_embeddings' ``SeqVecEmbedder`` (SeqVec protein embeddings, Heinzinger et al. 2019), on elmo-fast,
for users of SeqVec without bio_embeddings (which needs Python < 3.10) or seqvec::

    from elmo_fast.compat.seqvec import SeqVecEmbedder   # was: from bio_embeddings.embed import SeqVecEmbedder

    embedder = SeqVecEmbedder(weights_file="seqvec/weights.hdf5", options_file="seqvec/options.json")
    residues = embedder.embed("MKTAYIAKQR")                       # (3, 10, 1024)
    for per_residue in embedder.embed_many(sequences, batch_size=15000):   # residues per batch
        per_protein = SeqVecEmbedder.reduce_per_protein(per_residue)       # (1024,)

The same constructor (``weights_file`` + ``options_file``, or ``model_directory`` holding
``weights.hdf5`` + ``options.json``; ``device``; ``warmup_rounds=4``) and methods (``embed``,
``embed_batch``, ``embed_many(sequences, batch_size=residues)``, ``reduce_per_protein``), attributes
(``name``, ``embedding_dimension``, ``number_of_layers``) and fallbacks: on a GPU, a batch that raises a
``RuntimeError`` (out of memory) is retried one sequence at a time, and a sequence that still fails is
embedded on the CPU by a second model loaded then. Unlike bio_embeddings, which keeps that second model
(a full copy of the weights in host memory) for the rest of the run, it is freed as soon as a whole
batch runs on the GPU again; its LSTM states (a few KB) are kept, so that a later fallback loads the
model again and continues from them: the vectors are those of a CPU model kept all along. The model is
allennlp 0.9's stateful
``ElmoEmbedder`` (:mod:`elmo_fast.compat.allennlp09`), warmed up as bio_embeddings warms it, so the
vectors are bio_embeddings' own for the same calls (tested against its source).

Differences, on purpose: with no files given bio_embeddings downloads SeqVec; here that is an error
naming what to pass (elmo-fast fetches no SeqVec weights). ``model_directory`` reads ``weights.hdf5``
and ``options.json`` in it (bio_embeddings 0.2.2 looks for files named ``weights_file`` and
``options_file`` there, which a SeqVec download does not have). For a whole FASTA file,
``elmo-fast embed --fasta`` is faster (stateless, sorted by length, resumable).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import ElmoFastError, Param
from .allennlp09.commands_elmo import ElmoEmbedder

logger = logging.getLogger(__name__)

#: bio_embeddings' warm-up sequence (T0922 from CASP12), embedded ``warmup_rounds`` times at start
WARMUP_SEQUENCE = "MGSSHHHHHHSSGLVPRGSHMASVQKFPGDANCDGIVDISDAVLIMQTMANPSKYQMTDKGRINADVTGNSDGVTVLDAQFIQSYCLGLVELPPVE"


def _device(device: str | torch.device | None) -> torch.device:
    """bio_embeddings' choice: the given device, else CUDA when there is one, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class SeqVecEmbedder:
    """bio_embeddings' SeqVec embedder on elmo-fast (see the module docstring)."""

    name = "seqvec"
    embedding_dimension = 1024
    number_of_layers = 3
    necessary_files = ["weights_file", "options_file"]

    def __init__(self, warmup_rounds: int = 4, device: str | torch.device | None = None, **kwargs) -> None:
        self._options = kwargs
        self._device = _device(device)
        if kwargs.get("model_directory"):
            directory = Path(kwargs["model_directory"])
            self._weights_file, self._options_file = str(directory / "weights.hdf5"), str(directory / "options.json")
        elif kwargs.get("weights_file") and kwargs.get("options_file"):
            self._weights_file, self._options_file = str(kwargs["weights_file"]), str(kwargs["options_file"])
        else:
            raise ElmoFastError(
                "SeqVecEmbedder needs the model: give ",
                Param("weights_file"),
                " and ",
                Param("options_file"),
                " (or ",
                Param("model_directory"),
                " holding weights.hdf5 and options.json); elmo-fast downloads no SeqVec weights",
            )
        cuda_device = (self._device.index or 0) if self._device.type == "cuda" else -1
        self._model = ElmoEmbedder(
            weight_file=self._weights_file, options_file=self._options_file, cuda_device=cuda_device
        )
        self._model_fallback: ElmoEmbedder | None = None
        #: the CPU model's LSTM states while it is freed (see the module docstring)
        self._fallback_states: tuple[torch.Tensor, torch.Tensor] | None = None
        self.warmup_rounds = warmup_rounds
        for _ in range(warmup_rounds):  # bio_embeddings' work-around for ELMo's states, kept for its numbers
            self.embed(WARMUP_SEQUENCE)

    # ---- one sequence, a batch, many -------------------------------------------------------------------

    def embed(self, sequence: str) -> np.ndarray:
        """One protein (a str of residues) -> (3, L, D)."""
        return self._model.embed_sentence(list(sequence))

    def embed_batch(self, batch: Sequence[str]) -> Generator[np.ndarray, None, None]:
        """Proteins -> their (3, L, D) arrays, in order; on a GPU, the fallbacks of the module docstring."""
        if self._device.type == "cpu":
            yield from self._embed_batch_impl(batch, self._model)
            return
        try:
            yield from self._embed_batch_impl(batch, self._model)
            self._release_fallback_model()  # the GPU works again
        except RuntimeError as e:
            if len(batch) == 1:
                logger.error(
                    f"RuntimeError for sequence with {len(batch[0])} residues: {e}. Embedding on the CPU instead"
                )
                yield from self._embed_batch_impl(batch, self._get_fallback_model())
                return
            logger.error(f"Error processing batch of {len(batch)} sequences: {e}. Embedding each sequence alone")
            for sequence in batch:
                try:
                    yield from self._embed_batch_impl([sequence], self._model)
                except RuntimeError as e:
                    logger.error(
                        f"RuntimeError for sequence with {len(sequence)} residues: {e}. Embedding on the CPU instead"
                    )
                    yield from self._embed_batch_impl([sequence], self._get_fallback_model())

    def embed_many(self, sequences: Iterable[str], batch_size: int | None = None) -> Generator[np.ndarray, None, None]:
        """Proteins -> their arrays, in order; ``batch_size``: at most this many residues per batch (a longer
        protein goes alone), as bio_embeddings batches them; None: one at a time."""
        if not batch_size:
            for sequence in sequences:
                yield self.embed(sequence)
            return
        batch: list[str] = []
        length = 0
        for sequence in sequences:
            if len(sequence) > batch_size:
                logger.warning(
                    f"A sequence is {len(sequence)} residues long, which is longer than your "
                    f"`batch_size` parameter which is {batch_size}"
                )
                yield from self.embed_batch([sequence])
                continue
            if length + len(sequence) >= batch_size:
                yield from self.embed_batch(batch)
                batch, length = [], 0
            batch.append(sequence)
            length += len(sequence)
        yield from self.embed_batch(batch)

    @staticmethod
    def reduce_per_protein(embedding: np.ndarray) -> np.ndarray:
        """(3, L, D) -> (D,): the layers summed, then the mean over the residues (bio_embeddings')."""
        return embedding.sum(0).mean(0)

    # ---- bio_embeddings' internals, kept for code that overrides them -------------------------------------

    def _embed_batch_impl(self, batch: Sequence[str], model: ElmoEmbedder) -> Generator[np.ndarray, None, None]:
        yield from model.embed_batch([list(sequence) for sequence in batch])

    def _get_fallback_model(self) -> ElmoEmbedder:
        if self._model_fallback is None:
            logger.warning("Loading model for CPU into RAM. Embedding on the CPU is slower")
            model = ElmoEmbedder(weight_file=self._weights_file, options_file=self._options_file, cuda_device=-1)
            if self._fallback_states is None:
                for _ in range(self.warmup_rounds):
                    model.embed_sentence(list(WARMUP_SEQUENCE))
            else:  # loaded before, and freed: it continues from where it was
                model.elmo_bilm.set_states(self._fallback_states)
                self._fallback_states = None
            self._model_fallback = model
        return self._model_fallback

    def _release_fallback_model(self) -> None:
        """Free the CPU model (a full copy of the weights), keeping its LSTM states for a later fallback."""
        if self._model_fallback is not None:
            states = self._model_fallback.elmo_bilm.get_states()
            self._fallback_states = None if states is None else (states[0].clone(), states[1].clone())
            self._model_fallback = None
            logger.info("The GPU works again: the CPU model is freed")

    def __repr__(self) -> str:
        return f"SeqVecEmbedder(weights_file={self._weights_file!r}, device={str(self._device)!r})"


__all__ = ["SeqVecEmbedder", "WARMUP_SEQUENCE"]
