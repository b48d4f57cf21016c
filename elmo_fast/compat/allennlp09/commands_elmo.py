"""``allennlp.commands.elmo``: allennlp 0.9's ``ElmoEmbedder``, as flair's ``ELMoEmbeddings``, seqvec
and bio_embeddings' ``SeqVecEmbedder`` drive it, on the elmo-fast core.

Stateful as 0.9 was: batch row i starts from the LSTM states row i ended the previous batch with,
so that a call sequence gives allennlp 0.9's vectors for it (flair's dummy sentence at construction,
bio_embeddings' warm-up rounds included), and models trained on those vectors get what they were
trained on. The constructor takes 0.9's ``options_file``, ``weight_file`` (paths, or the official
models' URLs: :mod:`.file_utils`) and ``cuda_device``; the methods are 0.9's. Attributes flair reads
and writes: ``elmo_bilm`` (an :class:`~elmo_fast.ElmoBiLm`, ``elmo_bilm._elmo_lstm._states`` its
carried states), ``cuda_device`` (the device inputs go to follows the biLM's own, so
``ee.elmo_bilm.to(device)`` is enough). Out of memory reaches the caller as torch's
``OutOfMemoryError``, a ``RuntimeError``, which seqvec's and bio_embeddings' fallbacks catch.

Differences from 0.9, each on purpose: an empty sentence alone gives float32 zeros of the model's
shape (0.9: float64 (3, 0, 1024) whatever the model); ``embed_file`` writes through elmo-fast's
durable path (never a partial file) and its errors name the line (0.9: ``ConfigurationError``
listing blank lines' indexes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import IO

import numpy as np

from ...embedding.embedder import ElmoEmbedder as _CoreEmbedder
from .elmo_indexer import ELMoTokenCharactersIndexer
from .file_utils import cached_path
from .modules_elmo import _ElmoBiLm
from .settings import model_settings

DEFAULT_OPTIONS_FILE = (
    "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/"
    "elmo_2x4096_512_2048cnn_2xhighway_options.json"
)
DEFAULT_WEIGHT_FILE = (
    "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/"
    "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5"
)
DEFAULT_BATCH_SIZE = 64

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_OPTIONS_FILE",
    "DEFAULT_WEIGHT_FILE",
    "ElmoEmbedder",
    "elmo_command",
    "empty_embedding",
]


def empty_embedding() -> np.ndarray:
    """allennlp 0.9's array for an empty sentence (its shape is the original model's)."""
    return np.zeros((3, 0, 1024))


class ElmoEmbedder(_CoreEmbedder):
    """allennlp 0.9's ``ElmoEmbedder(options_file, weight_file, cuda_device=-1)``: stateful, on elmo-fast
    (see the module docstring). ``ELMO_FAST_PRECISION`` / ``ELMO_FAST_BACKEND`` choose the fast path's
    precision and backend (:mod:`.settings`)."""

    bilm_class = _ElmoBiLm

    def __init__(
        self, options_file: str = DEFAULT_OPTIONS_FILE, weight_file: str = DEFAULT_WEIGHT_FILE, cuda_device: int = -1
    ) -> None:
        super().__init__(
            cached_path(options_file),
            cached_path(weight_file),
            cuda_device=cuda_device,
            stateful=True,
            batch_size=DEFAULT_BATCH_SIZE,
            **model_settings(),
        )
        self.indexer = ELMoTokenCharactersIndexer()
        #: allennlp's device number (-1: the CPU); inputs follow the biLM, wherever it is moved
        self.cuda_device = cuda_device

    @property
    def device(self):
        """Where the biLM is (flair moves it with ``ee.elmo_bilm.to(device)``): inputs go there."""
        bilm = self.__dict__.get("elmo_bilm")
        return bilm.device if bilm is not None else self.__dict__["_device"]

    @device.setter
    def device(self, value) -> None:  # the core's constructor sets it before the biLM exists
        self.__dict__["_device"] = value

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "num_layers" not in state:  # allennlp 0.9's pickle: indexer, elmo_bilm and cuda_device only
            bilm = self.elmo_bilm
            self.batch_size = DEFAULT_BATCH_SIZE
            self.model_files = {}
            self.options_file = self.weight_file = None
            self.output_dim, self.num_layers = bilm.get_output_dim(), bilm.num_layers
            bilm.eval()

    def batch_to_embeddings(self, batch):
        """activations [B, L + 1, T, 2P] and mask [B, T] (long, as 0.9's) for a batch of tokenized sentences."""
        activations, mask = super().batch_to_embeddings(batch)
        return activations, mask.long()

    def embed_sentences(
        self,
        sentences: Iterable[Sequence[str]],  # type: ignore[override]
        batch_size: int = DEFAULT_BATCH_SIZE,
    ):
        return super().embed_sentences(sentences, batch_size)

    def embed_file(
        self,
        input_file: str | os.PathLike | IO,
        output_file_path: str | os.PathLike,  # type: ignore[override]
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
    ) -> None:
        """0.9's ``embed_file``: one sentence per line, whitespace-tokenized, in input order in batches of
        ``batch_size`` (the states flowing from each to the next), into allennlp's HDF5 layout."""
        super().embed_file(
            input_file, output_file_path, output_format, batch_size, forget_sentences, use_sentence_keys, progress=True
        )


def elmo_command(args) -> None:
    """``allennlp elmo``'s body (0.9's ``elmo_command(args)``), for code that calls it with parsed
    arguments; the command line itself is ``elmo-fast embed``, which takes the same flags."""
    embedder = ElmoEmbedder(args.options_file, args.weight_file, args.cuda_device)
    output_format = "all" if args.all else "top" if args.top else "average"
    source = open(args.input_file, encoding="utf-8") if isinstance(args.input_file, str) else args.input_file
    with source:
        embedder.embed_file(
            source, args.output_file, output_format, args.batch_size, args.forget_sentences, args.use_sentence_keys
        )
