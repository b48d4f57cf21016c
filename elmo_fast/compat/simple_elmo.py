"""simple_elmo's ``ElmoModel`` (ltgoslo/simple_elmo 0.9.2) on the elmo-fast core, without TensorFlow.

    from elmo_fast.simple_elmo import ElmoModel      # was: from simple_elmo import ElmoModel
    model = ElmoModel()
    model.load("209.zip")                            # an NLPL archive: a .zip or its folder
    vectors = model.get_elmo_vectors([["Hello", "world", "!"], ["Hi"]])   # float64 [2, 3, 1024]

The same methods, arguments, defaults, shapes and dtypes, and the same numbers (to fp32
rounding, ~1e-6; tested against simple_elmo 0.9.2 on TensorFlow 2.21), quirks included, for code
and downstream models made with simple_elmo's vectors. What simple_elmo computes, and so what
this does by default (``quirks=False`` gives the clean alternative where a quirk is a mistake):

* **Texts are not tokenized.** Each text is a list of tokens; a string is iterated, so its
  *characters* are the tokens (split it first: ``text.split()``).
* **The LSTM states carry from batch to batch** (bilm-tf's stateful biLM): texts go in input
  order in batches of ``max_batch_size``; row i of a batch starts from the final state of row i
  of the batch before, so a text's vectors depend on the texts before it and on the batch size.
  Every ``get_elmo_vectors`` / ``get_elmo_vector_average`` call starts from zero states (a new
  TensorFlow session in simple_elmo). ``load(..., stateful=False)``: every text from zero states.
* **Warm-up** (``warmup=True``, the default) runs the first batch once before the real pass, so
  the first batch is embedded from the states that batch left, not from zeros.
* **Padding is not zero.** Outputs are ``[N, longest text, D]`` zeros, and each batch writes
  ``[B, its longest, D]`` into it. Inside a batch, a position past a text's end holds what
  bilm-tf's graph computes there: the LSTM layers give 0, the token layer gives the context-free
  vector of the empty character row (the char CNN's biases through the highways and the
  projection). So with ``layers="average"`` such a position holds a third of that vector (of
  ``[e ; e]``), with ``"all"`` the token layer holds it, with ``"top"`` it is 0; positions past
  the batch's longest text are 0. ``quirks=False``: 0 past every text's end.
* **Sentence averages include that padding** (``get_elmo_vector_average``): the sum over every
  position of the text's batch, padding included, over the batch's longest length, then scaled to
  unit L2 norm (so a text's average depends on its batch-mates' lengths, with ``"average"`` and
  ``"all"``). With ``layers="all"``, simple_elmo reshapes the ``[L, T, D]`` block of a text to
  ``[T, L, D]`` (a reshape, not a transpose: the layers and positions are interleaved) before
  summing over the first axis, and normalizes the ``[L, D]`` result as one vector (its Frobenius
  norm). A batch whose texts are all empty gives NaN (0 / 0). ``quirks=False``: the mean over the
  text's own tokens, of each layer with ``"all"``, each scaled to unit norm (zeros for an empty text).
* ``"average"`` is bilm-tf's ``weight_layers`` at its initial values: ``softmax(0 + 1/n)`` = an
  even mix of the ``n`` layers times ``gamma`` = 1; ``"top"`` the top LSTM layer; ``"all"`` every
  layer, ``[N, n, longest, D]``, the token layer first, ``[e ; e]``.
* Outputs are float64 (numpy's default, as simple_elmo allocates them), computed in float32.
* The vocabulary (``vocab.txt``, first ``limit`` words) only caches character ids, except for the
  quirks of :mod:`~elmo_fast.compat.simple_elmo_vocab` (tokens ``<S>`` and ``</S>`` get the
  sentence-boundary ids; with no ``<S>``/``</S>`` among the first ``limit`` words, the last of them
  gets the sentence-end ids).
* ``get_elmo_substitutes`` (``full=True``): see :mod:`~elmo_fast.compat.simple_elmo_lm`
  (every prediction comes from one token and zero LSTM states: no context).

Differences, on purpose:

* TensorFlow arguments are accepted and ignored: ``session=`` (simple_elmo then reused the
  session's graph, its earlier ``layers`` choice and its LSTM states; here each call starts afresh
  and ``layers`` is honoured), and the TF attributes (``session``, ``sentence_character_ids``,
  ``elmo_sentence_input``, ``sentence_embeddings_op``, ``init_state_*``) stay None.
* ``full=True`` on a bilm-tf training folder (TensorFlow's ``checkpoint`` file, ``model.ckpt-N.*``,
  ``options.json``, ``vocab.txt``) reads the latest checkpoint, as simple_elmo does, but without
  TensorFlow (:mod:`elmo_fast.convert`, through a temporary folder); elsewhere (a zip too) it reads
  the softmax from ``softmax.hdf5`` (``softmax/W`` [V, P], ``softmax/b`` [V], as ``elmo-fast
  train`` and ``elmo-fast convert`` write it) beside ``model.hdf5``. The vocabulary (``vocab.txt``
  or ``.gz``) must have V lines. ``get_elmo_vectors`` works on a full model too.
* ``n_characters: 261`` in ``options.json`` (a training-time value) loads; simple_elmo refused it
  without ``full=True``.
* Errors: a missing or unreadable archive raises :class:`SimpleElmoExit`, an
  :class:`~elmo_fast.errors.ModelFileError` that is also a ``SystemExit`` (what simple_elmo
  raised, so ``except SystemExit`` still catches it, and so does ``except Exception``); bad
  arguments raise :class:`~elmo_fast.errors.ElmoFastError` (a ``ValueError``) where simple_elmo
  failed inside TensorFlow or numpy.
* simple_elmo calls ``logging.basicConfig(level=INFO)`` when an ``ElmoModel`` is made; this logs
  to the ``elmo_fast.compat.simple_elmo`` logger and leaves the logging setup to the program.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..bilm.model import ElmoBiLm
from ..bilm.precision import Precision, resolve_precision
from ..convert import convert
from ..devices import resolve_device
from ..durable import scratch_dir
from ..errors import ElmoFastError, InputError, ModelFileError, Param
from ..formats.bilm_tf import ElmoWeights, load_model_files, load_softmax
from ..formats.nlpl_archive import NlplArchive, is_nlpl_zip, open_nlpl
from . import simple_elmo_lm
from .simple_elmo_vocab import Batcher, UnicodeCharsVocabulary

LAYERS = ("average", "top", "all")
LOADED = "The model is now loaded."
_TOKEN_CACHE_MB = 256  # as ElmoEmbedder's default


class SimpleElmoExit(ModelFileError, SystemExit):
    """A model that cannot be loaded: what simple_elmo raised ``SystemExit`` for, and an
    :class:`~elmo_fast.errors.ModelFileError`; exits with the message when nothing catches it."""

    def __init__(self, *parts: Any) -> None:
        super().__init__(*parts)
        self.code = str(self)  # SystemExit's status: the message, printed, exit status 1


def _from_checkpoint(folder: str, vocab_size: int) -> tuple[ElmoWeights, tuple[torch.Tensor, torch.Tensor]]:
    """The weights and the softmax of a bilm-tf training folder's latest checkpoint, read without
    TensorFlow (:func:`elmo_fast.convert.convert`, into a temporary folder removed at once)."""
    with scratch_dir("elmo_fast_checkpoint_") as tmp:
        convert(folder, tmp)
        weights = load_model_files(os.path.join(tmp, "options.json"), os.path.join(tmp, "weights.hdf5"))
        softmax_path = os.path.join(tmp, "softmax.hdf5")
        if not os.path.isfile(softmax_path):
            raise SimpleElmoExit(
                f"{folder}: full=True needs the language model's softmax, and the checkpoint holds none (lm/softmax/W)"
            )
        softmax = load_softmax(softmax_path, vocab_size, weights.options.projection_dim)
    return weights, softmax


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


class ElmoModel:
    """simple_elmo's ``ElmoModel``: ``load`` an NLPL archive, then ``get_elmo_vectors``,
    ``get_elmo_vector_average`` or (``full=True``) ``get_elmo_substitutes``. See the module
    docstring for what is computed, quirks included."""

    def __init__(self) -> None:
        self.batcher: Batcher | None = None
        self.batch_size: int | None = None
        self.max_chars: int | None = None
        self.vector_size: int | None = None
        self.n_layers: int | None = None
        #: the language model's vocabulary (``full=True``), a simple_elmo ``UnicodeCharsVocabulary``
        self.vocab: UnicodeCharsVocabulary | None = None
        # simple_elmo's TensorFlow objects: never set here
        self.session = None
        self.model = None
        self.sentence_character_ids = None
        self.elmo_sentence_input = None
        self.sentence_embeddings_op = None
        self.init_state_tensors = None
        self.final_state_tensors = None
        self.init_state_values = None
        self.logger = logging.getLogger(__name__)
        #: the biLM (an :class:`~elmo_fast.ElmoBiLm`), once loaded
        self.elmo_bilm: ElmoBiLm | None = None
        #: the archive's files and its meta.json (:class:`~elmo_fast.formats.nlpl_archive.NlplArchive`)
        self.archive: NlplArchive | None = None
        #: ``softmax/W`` [V, P] and ``softmax/b`` [V] (``full=True``)
        self.softmax: tuple[torch.Tensor, torch.Tensor] | None = None
        self._padding_vector: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------------
    # loading

    def load(
        self,
        directory: str | os.PathLike,
        max_batch_size: int = 32,
        limit: int = 100,
        full: bool = False,
        *,
        stateful: bool = True,
        device: str | torch.device = "cpu",
        backend: str = "auto",
        precision: str | Precision | None = None,
        dtype: torch.dtype | None = None,
    ) -> str:
        """Load an NLPL archive (a folder or a ``.zip``; see :mod:`~elmo_fast.formats.nlpl_archive`).

        max_batch_size: texts per batch. limit: the vocabulary's first words whose character ids are
        cached (see the module docstring for when that matters). full: also load the language
        model's softmax and whole vocabulary, for :meth:`get_elmo_substitutes`. Returns
        ``"The model is now loaded."``, as simple_elmo does.

        elmo-fast's (keyword-only): stateful=False starts every text from zero LSTM states;
        device, backend, precision (``dtype`` its alias) as :class:`~elmo_fast.ElmoEmbedder`'s.
        """
        path = os.fspath(directory)
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1:
            raise ElmoFastError(Param("max_batch_size"), f" must be an integer >= 1, got {max_batch_size!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer))):
            raise ElmoFastError(Param("limit"), f" must be an integer (or None: the whole vocabulary), got {limit!r}")
        if not os.path.exists(path):
            raise SimpleElmoExit(f"Error: path not found for {path}!")
        if not (os.path.isdir(path) or is_nlpl_zip(path)):
            raise SimpleElmoExit(
                f"{path}: either provide a path to a directory with the model or to the model in a ZIP archive"
            )
        device = resolve_device(device)
        precision = resolve_precision(precision, dtype)
        precision.check_device(device)  # before reading the model
        try:
            archive = open_nlpl(path)
        except ModelFileError as e:
            raise SimpleElmoExit(str(e)) from None
        self.logger.info("Loading model from %s...", path)
        options = archive.options
        vocab_name = archive.describe(archive.vocab) if archive.vocab else "vocabulary"
        lines = archive.vocab_lines() if archive.vocab else None
        batcher = Batcher(lines, options.max_characters_per_token, limit=limit, source=vocab_name)
        vocab = softmax = None
        if full:
            if archive.vocab is None:
                raise SimpleElmoExit(
                    f"{path}: full=True needs the language model's vocabulary (vocab.txt or "
                    f"vocab.txt.gz), and the archive has none"
                )
            vocab = UnicodeCharsVocabulary(
                archive.vocab_lines(), options.max_characters_per_token, validate=True, source=vocab_name
            )
            if archive.checkpoint is not None:  # what simple_elmo's full=True reads: the run's latest checkpoint
                weights, softmax = _from_checkpoint(path, vocab.size)
            elif archive.softmax is None:
                raise SimpleElmoExit(
                    f"{path}: full=True needs the language model's softmax: a bilm-tf training "
                    f"checkpoint (TensorFlow's checkpoint file and model.ckpt-N.*), or softmax.hdf5 "
                    f"(softmax/W [{vocab.size}, {options.projection_dim}] and softmax/b) beside the "
                    f"weights"
                )
            else:
                softmax = archive.load_softmax(vocab.size)
        if not full or archive.checkpoint is None:
            if archive.weights is None:
                raise SimpleElmoExit(
                    f"Error: no HDF5 model files found in the {path} directory! (model.hdf5 or another *.hdf5)"
                )
            weights = archive.load_weights()
        entry_bytes = 4 * (options.projection_dim + 8 * options.cell_dim)
        bilm = ElmoBiLm.from_weights(
            weights,
            stateful=stateful,
            backend=backend,
            precision=precision,
            token_cache_size=_TOKEN_CACHE_MB * 2**20 // entry_bytes,
        )
        self.elmo_bilm = bilm.to(device).eval()
        self.softmax = None if softmax is None else (softmax[0].to(device), softmax[1].to(device))
        self.archive, self.batcher, self.vocab = archive, batcher, vocab
        self.batch_size = int(max_batch_size)
        self.max_chars = options.max_characters_per_token
        self.vector_size = 2 * options.projection_dim
        self.n_layers = options.n_layers + 1
        self._padding_vector = None
        return LOADED

    def _bilm(self) -> ElmoBiLm:
        if self.elmo_bilm is None:
            raise ElmoFastError("no model loaded: call load(directory) first")
        return self.elmo_bilm

    # ------------------------------------------------------------------------------------------
    # vectors

    @staticmethod
    def _check_layers(layers: str) -> None:
        if layers not in LAYERS:
            raise ElmoFastError(Param("layers"), f" must be one of {', '.join(map(repr, LAYERS))}, got {layers!r}")

    @staticmethod
    def _texts(texts: Any) -> list:
        if isinstance(texts, (str, bytes)):
            raise InputError("texts must be a list of texts, each a list of tokens, not a single string")
        texts = list(texts)
        if not texts:
            raise InputError("texts is empty: nothing to embed")
        for i, text in enumerate(texts):
            if isinstance(text, bytes) or not hasattr(text, "__len__"):
                raise InputError(f"text {i}: expected a list of tokens (str), got {type(text).__name__}")
            for token in text:
                if not isinstance(token, str):
                    raise InputError(f"text {i}: every token must be a str, got {type(token).__name__} {token!r:.40}")
        return texts

    def padding_vector(self) -> torch.Tensor:
        """[P] float32: what bilm-tf's token layer holds at padding positions (the context-free
        vector of an all-zero character row)."""
        if self._padding_vector is None:
            bilm = self._bilm()
            ids = torch.zeros(1, self.max_chars, dtype=torch.long, device=bilm.device)
            with torch.inference_mode():
                self._padding_vector = bilm.token_embedder(ids)[0].float().cpu()
        return self._padding_vector

    def _layers(self, chunk: list) -> tuple[torch.Tensor, torch.Tensor]:
        """activations [B, n, T, D] float32 (0 past each text) and mask [B, T], from the biLM."""
        bilm = self._bilm()
        ids = torch.from_numpy(self.batcher.token_ids(chunk))
        with torch.no_grad():
            activations, mask = bilm.embed(ids)
        return activations.float().cpu(), mask.bool().cpu()

    def _mix(self, activations: torch.Tensor, mask: torch.Tensor, layers: str, quirks: bool) -> torch.Tensor:
        """[B, n, T, D] -> [B, T, D] ("average", "top") or [B, n, T, D] ("all"), bilm-tf's weight_layers."""
        if quirks and not bool(mask.all()):
            pad = self.padding_vector()
            activations[:, 0][~mask] = torch.cat([pad, pad])
        if layers == "all":
            return activations
        if layers == "top":
            return activations[:, -1]
        n = activations.shape[1]
        w = torch.softmax(torch.full((n,), 1.0 / n), dim=0)  # weight_layers' initial softmax(0 + 1/n)
        mixed = w[0] * activations[:, 0]
        for k in range(1, n):
            mixed = mixed + w[k] * activations[:, k]
        return mixed

    def _batches(
        self, texts: list, warmup: bool, layers: str, quirks: bool
    ) -> Iterator[tuple[list, torch.Tensor, torch.Tensor]]:
        """(chunk, mixed outputs, mask) per batch of ``batch_size`` texts, in order, from zero states
        (a new TensorFlow session's), after the warm-up pass over the first batch."""
        bilm = self._bilm()
        bilm.reset_states()
        if warmup:
            self.warmup(None, texts)
        for chunk in _chunks(texts, self.batch_size):
            activations, mask = self._layers(chunk)
            yield chunk, self._mix(activations, mask, layers, quirks), mask

    def warmup(self, sess: Any = None, texts: Sequence[Sequence[str]] = ()) -> None:
        """Run the first batch of ``texts`` and drop its outputs (its LSTM states stay, for the
        batches that follow inside the same ``get_*`` call). ``sess`` is ignored."""
        first = list(texts)[: self.batch_size]
        if first:
            self.logger.info("Warming up ELMo on %d sentences...", len(first))
            self._layers(first)

    def get_elmo_vectors(
        self,
        texts: Sequence[Sequence[str]],
        warmup: bool = True,
        layers: str = "average",
        session: Any = None,
        *,
        quirks: bool = True,
    ) -> np.ndarray:
        """Contextual vectors of every token: float64 [N, longest, D] (``"average"``, ``"top"``) or
        [N, n_layers, longest, D] (``"all"``). texts: lists of tokens. warmup: run the first batch
        once before (see the module docstring). session: ignored (TensorFlow's).
        quirks=False: zeros past each text's end (simple_elmo's padding values otherwise)."""
        self._bilm()
        self._check_layers(layers)
        texts = self._texts(texts)
        longest = max(len(t) for t in texts)
        D = self.vector_size
        shape = (len(texts), self.n_layers, longest, D) if layers == "all" else (len(texts), longest, D)
        out = np.zeros(shape)
        row = 0
        for chunk, vectors, _ in self._batches(texts, warmup, layers, quirks):
            T = vectors.shape[-2]
            out[row : row + len(chunk), ..., :T, :] = vectors.numpy()
            row += len(chunk)
        return out

    def get_elmo_vector_average(
        self,
        texts: Sequence[Sequence[str]],
        warmup: bool = True,
        layers: str = "average",
        session: Any = None,
        *,
        quirks: bool = True,
    ) -> np.ndarray:
        """One unit-norm vector per text: float64 [N, D] (``"average"``, ``"top"``) or [N, n_layers, D]
        (``"all"``), computed as simple_elmo does, padding included (see the module docstring).
        quirks=False: the mean over the text's own tokens (per layer with "all"), scaled to unit norm."""
        self._bilm()
        self._check_layers(layers)
        texts = self._texts(texts)
        D, n = self.vector_size, self.n_layers
        out = np.zeros((len(texts), n, D) if layers == "all" else (len(texts), D))
        row = 0
        for chunk, vectors, mask in self._batches(texts, warmup, layers, quirks):
            v = vectors.numpy()
            for s in range(len(chunk)):
                out[row] = self._average(v[s], int(mask[s].sum()), layers, quirks)
                row += 1
        return out

    def _average(self, v: np.ndarray, length: int, layers: str, quirks: bool) -> np.ndarray:
        """One text's average from its block of its batch's outputs, v [T, D] or [n, T, D] float32."""
        if quirks:
            if layers == "all":
                v = v.reshape(v.shape[1], v.shape[0], v.shape[2])  # simple_elmo's reshape of [n, T, D]
            block = v.astype(np.float64)
            fingerprint = np.sum(block, axis=0) / block.shape[0]
            return fingerprint / np.linalg.norm(fingerprint)
        own = v[..., :length, :].astype(np.float64)
        mean = own.mean(axis=-2) if length else np.zeros(own.shape[:-2] + own.shape[-1:])
        norm = np.linalg.norm(mean, axis=-1, keepdims=True)
        return np.divide(mean, norm, out=np.zeros_like(mean), where=norm > 0)

    # ------------------------------------------------------------------------------------------
    # the language model

    def get_elmo_substitutes(
        self, data: Sequence[str], topn: int = 3, nodelimiters: bool = True, *, quirks: bool = True
    ) -> list[list[dict]]:
        """The language model's top ``topn`` predictions for every word of each raw sentence (a
        string, split on whitespace), forward and backward: simple_elmo's list of sentences, each a
        list of ``{"word", "forward": {"candidates", "candidate_words", "logp"}, "backward": {...}}``.
        Needs ``load(..., full=True)``. See :mod:`~elmo_fast.compat.simple_elmo_lm` for what
        simple_elmo computes (quirks=True) and the clean alternative (quirks=False)."""
        bilm = self._bilm()
        if self.vocab is None or self.softmax is None:
            raise ElmoFastError("get_elmo_substitutes needs the language model: load(directory, full=True)")
        if isinstance(topn, bool) or not isinstance(topn, (int, np.integer)) or not 1 <= topn <= self.vocab.size:
            raise ElmoFastError(
                Param("topn"), f" must be an integer in 1..{self.vocab.size} (the vocabulary's size), got {topn!r}"
            )
        if isinstance(data, str):
            raise InputError("data must be a list of sentences (strings), not a single string")
        data = list(data)
        for i, s in enumerate(data):
            if not isinstance(s, str):
                raise InputError(
                    f"sentence {i}: expected a string (raw text, split on whitespace), got {type(s).__name__}"
                )
        lm = simple_elmo_lm.LanguageModelHead(bilm, *self.softmax)
        if quirks:
            return simple_elmo_lm.substitutes_as_simple_elmo(
                data, self.vocab, lm, self.batch_size, int(topn), nodelimiters
            )
        return simple_elmo_lm.substitutes_in_context(data, self.vocab, lm, self.batch_size, int(topn), nodelimiters)
