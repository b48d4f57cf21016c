"""``ElmoEmbedder``: sentences in, numpy vectors out (allennlp's ``ElmoEmbedder``), and HDF5 files."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import IO, Any

import numpy as np
import torch

from ..bilm.model import ElmoBiLm
from ..bilm.precision import Precision, resolve_precision
from ..devices import resolve_device
from ..errors import ElmoFastError, Param
from ..model_source import resolve_model
from ..sentences import as_batch, as_sentence
from .input_guard import DEFAULT_MAX_LINE_LENGTH
from .lines import read_sentences  # noqa: F401  (public here too)
from .onnx_backend import ONNX, OnnxBiLm, check_onnx_settings
from .options import DEFAULT_WINDOW, OUTPUT_FORMATS, EmbedOptions  # noqa: F401  (public here too)
from .pipeline import embed_corpus


def _device_name(device: object) -> str:
    """A device's name without asking for it (a GPU need not be there to compare two)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu" if device == -1 else f"cuda:{device}"
    try:
        return str(torch.device(device))  # type: ignore[arg-type]
    except (RuntimeError, TypeError):
        return repr(device)


class ElmoEmbedder:
    """Embed tokenized sentences with a biLM given by its ``options.json`` and ``weights.hdf5``, or
    by a model directory (``model_dir=``, or the first argument alone) of bilm-tf (options.json +
    weights.hdf5) or ELMoForManyLangs (its config, dictionaries and state dicts; the model's own
    front end then turns tokens into ids, see :class:`~elmo_fast.bilm.model.ElmoBiLm`); a directory
    holding both kinds needs ``model_format`` ("bilm-tf" or "elmoformanylangs"). With no
    model at all (``ElmoEmbedder()``), the English model bundled in the package (``default``; one
    line on the ``elmo_fast`` logger says so), as allennlp 0.9's ``ElmoEmbedder()`` used its default.
    ``model=`` names a model as ``--model`` does: ``"default"``, an official name (``"original"``), a
    Hugging Face Hub repository (``"hf:OWNER/REPO[@REVISION][/SUBFOLDER]"``, the ``[hub]`` extra) or a
    pinned URL (``"URL#sha256=HEX"``), fetched once into the cache (:mod:`elmo_fast.pretrained`).

    backend: "auto" (the fused fast path when the extension is built, else the reference),
    "fast", "reference", or "onnx": a graph written by ``elmo-fast export onnx``, given as
    ``onnx_file`` (the model is in it: no model files then), run in ONNX Runtime on the CPU,
    stateless, in the precision it was exported in (:mod:`~elmo_fast.embedding.onnx_backend`); an
    ``onnx_file`` with backend "auto" means "onnx". token_cache_mb bounds the cache of distinct tokens' context-free
    results kept across batches by the fast path (0 turns it off). Results do not depend on it, nor
    on batching, beyond fp32 rounding (~1e-6: a GEMM's rounding varies with its number of rows).

    precision (:mod:`~elmo_fast.bilm.precision`; ``dtype``, its older name, is an alias:
    torch.bfloat16 is "bf16"): "fp32" (default; max abs error <= 1e-5 against the reference),
    "tf32" (TF32 GEMMs on CUDA: max error <= 1% of a layer's max |value|, RMS <= 0.25%; exactly
    fp32 on a CPU), "bf16" (bf16 GEMMs, fp32 accumulation: <= 5% and RMS <= 1%), "fp16" (CUDA
    only: <= 1% and RMS <= 0.25%); each bound per output layer, against the fp32 reference, tested.

    Each sentence gets an array ``(L + 1, T, 2P)``: the context-free token layer (duplicated to 2P,
    as allennlp does) and the L biLSTM layers, without the sentence boundaries.

    stateful=False (default) makes a sentence's vectors independent of batching; stateful=True
    carries the LSTM states from batch to batch, as allennlp and bilm-tf do.

    device: "cpu", "cuda", "cuda:N" or a torch.device; an int is allennlp's ``cuda_device``
    (-1: the CPU, N >= 0: cuda:N), so ``ElmoEmbedder(options, weights, 0)`` and
    ``ElmoEmbedder(options, weights, cuda_device=-1)`` mean what they meant in allennlp 0.9.
    """

    #: the biLM class it builds (a compatibility front may name a subclass)
    bilm_class: type[ElmoBiLm] = ElmoBiLm

    def __init__(
        self,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        device: str | int | torch.device = "cpu",
        batch_size: int = 64,
        stateful: bool = False,
        backend: str = "auto",
        token_cache_mb: float = 256.0,
        dtype: torch.dtype | None = None,
        *,
        cuda_device: int | None = None,
        model_dir: str | os.PathLike | None = None,
        precision: str | Precision | None = None,
        model_format: str | None = None,
        model: str | None = None,
        onnx_file: str | os.PathLike | None = None,
    ) -> None:
        if cuda_device is not None:  # allennlp's name for it; an int third argument means the same
            if device != "cpu" and _device_name(device) != _device_name(cuda_device):
                raise ElmoFastError(
                    "give ",
                    Param("device"),
                    " or ",
                    Param("cuda_device"),
                    f", not both (got {device!r} and {cuda_device!r})",
                )
            device = cuda_device
        if batch_size < 1:
            raise ElmoFastError(Param("batch_size"), f" must be >= 1, got {batch_size}")
        if token_cache_mb < 0:
            raise ElmoFastError(Param("token_cache_mb"), f" must be >= 0, got {token_cache_mb}")
        self.device = resolve_device(device)
        precision = resolve_precision(precision, dtype)
        precision.check_device(self.device)  # before loading the model
        self.batch_size = batch_size
        self.elmo_bilm: ElmoBiLm | OnnxBiLm
        if onnx_file is not None and backend not in ("auto", ONNX):
            raise ElmoFastError(
                Param("onnx_file"),
                " runs a graph in ONNX Runtime: give it with ",
                Param("backend", ONNX),
                f", not {backend!r}",
            )
        if backend == ONNX or onnx_file is not None:
            model_given = any(x is not None for x in (options_file, weight_file, model_dir, model_format, model))
            check_onnx_settings(onnx_file, model_given, self.device, stateful, precision.name)
            self.elmo_bilm = OnnxBiLm(onnx_file)
            self.model_files = {"onnx": onnx_file}
            self.options_file = self.weight_file = None
            self.output_dim = self.elmo_bilm.get_output_dim()
            self.num_layers = self.elmo_bilm.num_layers
            return
        source = resolve_model(options_file, weight_file, model_dir, model_format, model)
        weights = source.weights
        #: the files that define the model, by role: embed_file(resume=True) records their digests,
        #: to refuse resuming with other ones
        self.model_files: dict[str, str | os.PathLike] = source.files
        self.options_file, self.weight_file = self.model_files.get("options"), self.model_files.get("weights")
        o = weights.options
        # a cached token holds its vector [P] and its layer-0 gates [2, 4C], in fp32
        entry_bytes = 4 * (o.projection_dim + 8 * o.cell_dim)
        cache_size = int(token_cache_mb * 2**20 // entry_bytes)
        self.elmo_bilm = (
            self.bilm_class.from_weights(
                weights, stateful=stateful, backend=backend, token_cache_size=cache_size, precision=precision
            )
            .to(self.device)
            .eval()
        )
        self.output_dim = self.elmo_bilm.get_output_dim()
        self.num_layers = self.elmo_bilm.num_layers

    def save_model(self, directory: str | os.PathLike) -> tuple[str, str]:
        """Write the biLM as ``options.json`` + ``weights.hdf5`` (bilm-tf layout) into ``directory``; an
        ELMoForManyLangs model in its own layout (see :meth:`ElmoBiLm.save`)."""
        if isinstance(self.elmo_bilm, OnnxBiLm):
            raise ElmoFastError(
                f"this embedder runs the ONNX graph {self.elmo_bilm.path}, which holds no bilm-tf files to save"
            )
        return self.elmo_bilm.save(directory)

    def _empty(self) -> np.ndarray:
        return np.zeros((self.num_layers, 0, self.output_dim), dtype=np.float32)

    @torch.inference_mode()
    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """activations [B, L + 1, T, 2P] and mask [B, T] for a batch of tokenized sentences."""
        # ids stay on the CPU: a biLM on a GPU plans its forward from them there, without a device sync
        return self.elmo_bilm.embed(self.elmo_bilm.batch_to_ids(batch))

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """One tokenized sentence (a list, a tuple or a 1-D numpy array of str) -> float32 array
        (L + 1, T, 2P)."""
        return self.embed_batch([as_sentence(sentence, "sentence")])[0]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """A batch of tokenized sentences (:mod:`elmo_fast.sentences`: lists, tuples, numpy arrays of
        str) -> a list of arrays (L + 1, T_i, 2P), in order."""
        batch = as_batch(batch, "batch")
        if len(batch) == 0:
            return []
        # allennlp skips the model for [[]] (states untouched); stateless, any all-empty batch is zeros
        if all(len(s) == 0 for s in batch) and (len(batch) == 1 or not self.elmo_bilm.stateful):
            return [self._empty() for _ in batch]
        activations, mask = self.batch_to_embeddings(batch)
        activations = activations.float().cpu().numpy()
        lengths = mask.sum(dim=1).tolist()
        return [activations[i, :, :n] if n else self._empty() for i, n in enumerate(lengths)]

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int | None = None
    ) -> Iterator[np.ndarray]:
        """Lazily embed an iterable of tokenized sentences (each as :meth:`embed_sentence` takes it),
        in batches, yielding in input order."""
        batch_size = batch_size or self.batch_size
        if isinstance(sentences, (str, bytes)):
            as_batch(sentences, "sentences")  # the error: a string, not sentences
        it = iter(sentences)
        start = 0
        while chunk := list(islice(it, batch_size)):
            yield from self.embed_batch([as_sentence(s, f"sentences[{start + i}]") for i, s in enumerate(chunk)])
            start += len(chunk)

    def embed_file(
        self,
        input_file: str | os.PathLike | IO,
        output_file_path: str | os.PathLike,
        output_format: str = "all",
        batch_size: int | None = None,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
        progress: bool | str = True,
        *,
        max_tokens_per_batch: int | None = None,
        bucketing: bool | None = None,
        window: int = DEFAULT_WINDOW,
        resume: bool = False,
        overwrite: bool = True,
        skip_empty: bool = False,
        encoding_errors: str = "strict",
        started: float | None = None,
        distributed: bool = False,
        tokenize: bool = False,
        max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
        fasta: bool = False,
        fasta_split_char: str | None = None,
        fasta_id_field: int = 1,
        per_protein: str | bool | None = None,
        fasta_stop: str | None = None,
        fasta_gaps: str | None = None,
    ) -> dict[str, Any]:
        """Embed a file of whitespace-tokenized sentences (one per line) into allennlp's HDF5 layout.

        ``tokenize=True`` reads raw text instead (still one sentence per line): each line goes
        through :func:`elmo_fast.tokenizer.tokenize_line`, the tokenizer of the bundled model's
        training corpus (punctuation and clitics split off, as in the 1B Word Benchmark); keys and
        ``sentence_to_index`` still hold the lines as written.

        One float32 dataset per line, keyed by the line's index (or by its text with
        ``use_sentence_keys``), of shape (3, T, 2P) for ``"all"`` or (T, 2P) for ``"top"`` /
        ``"average"`` / ``"sum"``; plus ``sentence_to_index``, a JSON map from each line's text to its key
        (left out with ``forget_sentences`` or ``use_sentence_keys``, as allennlp does).

        ``fasta=True`` reads proteins instead (:mod:`elmo_fast.embedding.fasta`): one FASTA record a
        sequence, one residue a token, each dataset named by the record's id (its header's first word, or
        seqvec's rule: field ``fasta_id_field`` of the header split at ``fasta_split_char``); a malformed
        file is an error naming the line. Residues are upper-cased; ``fasta_stop``: a stop ``*`` ending a
        record is dropped ("drop", the default), kept as a character ("keep": every ``*``) or refused
        ("refuse"), and one inside a sequence is refused unless "keep"; ``fasta_gaps``: alignment gaps
        (``-``, ``.``) are refused ("refuse", the default: the error names the record and the position)
        or removed ("remove"). ``per_protein``: the mean over the residues, instead of the
        residues' vectors (``"only"`` or True) or beside them as the dataset's attribute ``per_protein``
        (``"also"``). Batches hold at most ``max_tokens_per_batch`` padded residues (records x the longest;
        default 15,000, seqvec's ``--batchsize``) of records sorted by length, and no bound on the number
        of records unless ``batch_size`` is given (stateless): many short proteins make one batch, as in
        seqvec, instead of batches of 64.

        The input (a path, or a binary or text stream) is read lazily and results are written as
        their batches finish, so memory stays flat however long the corpus. Stateless (the
        default), ``window`` sentences at a time are sorted by length and cut into batches of at
        most ``batch_size`` sentences and ``max_tokens_per_batch`` padded tokens (default
        ``DEFAULT_MAX_TOKENS``); vectors do not depend on it (beyond fp32 rounding, ~1e-6), keys and
        their order are unchanged.
        ``bucketing=False`` keeps input order. Stateful embedders keep input order, and refuse
        ``max_tokens_per_batch``. A batch that runs out of memory is halved and retried (stateless);
        one sentence that cannot fit alone is an :class:`InputError` naming its line.

        The output is written under a temporary name and renamed when complete, so a failed or
        interrupted run leaves none. ``resume=True`` works in ``OUTPUT.partial/`` instead, which
        keeps completed windows across crashes and kills: a later ``resume=True`` run continues
        where it stopped and gives the same file as an uninterrupted run. Each saved window carries
        a completion record (its size and SHA-256, written after it is on disk); a resumed run
        redoes, with a note on stderr, any window whose file does not match it, and starts over
        when the manifest is damaged. An input that cannot be read twice (stdin, a pipe, a FIFO)
        is read once: the saved windows are checked against its lines as they pass.

        Temporary files of killed plain runs beside the output (``.OUTPUT.HOST-PID.*.elmo-tmp``) are
        removed when their process is gone, and named otherwise (on stderr, with ``progress``).

        The input may be gzip, bzip2 or xz compressed (recognised by its content, not its name);
        a byte-order mark at its start is dropped. Bad lines are errors naming them: not UTF-8
        (``encoding_errors="replace"`` goes on with U+FFFD), empty or all-whitespace
        (``skip_empty=True`` skips them, keeping the others' line numbers as keys), longer than
        ``max_line_length`` characters (default 1,000,000; None: no bound), which is found before
        the line is held whole (``/dev/zero`` is an error, not a MemoryError). An existing
        output is replaced only with ``overwrite`` (True by default here, as before; the CLI
        defaults to refusing). The output's folder, name and length are checked before any work.

        One run per output: the run holds a lock beside it (``.OUTPUT.elmo-lock``) from its first
        check to its end, so a second run on the same output, in this process or another, fails
        at once with an error naming the holder's PID; a killed run's lock never blocks.

        progress: a bar of tokens on stderr (its total known once a background pass over a file
        input has counted them) and two closing lines; ``"log"`` prints the bar on a line of its
        own at most every 10 s, for log files; False, nothing. started: a ``time.perf_counter()``
        reading that the closing wall time counts from (default: this call), so that a program can
        include its start-up. Returns counts, timings (``seconds`` embedding and writing,
        ``steady_tokens_per_s`` after the first batch, None with one batch) and the settings.

        distributed=True: this process is one rank of a torch.distributed group (the default process
        group, initialised; ``elmo-fast embed`` under ``torchrun`` does this) and every rank calls
        embed_file with the same arguments. The input's windows are dealt round-robin among the
        ranks; each writes its shards into ``OUTPUT.partial/`` (``resume=True`` is implied, so a
        restarted group continues from what is done), and rank 0 assembles the same file a single
        process writes. The input must be a path, and it and the output's directory must be on a
        filesystem that every rank shares. Stateful embedders are refused (their state order needs
        one process). Rank 0 alone shows progress, for the whole group; its returned counts are the
        group's, the other ranks' their own.
        """
        options = EmbedOptions(
            output_format,
            batch_size,
            forget_sentences,
            use_sentence_keys,
            progress,
            max_tokens_per_batch=max_tokens_per_batch,
            bucketing=bucketing,
            window=window,
            resume=resume,
            overwrite=overwrite,
            skip_empty=skip_empty,
            encoding_errors=encoding_errors,
            started=started,
            distributed=distributed,
            tokenize=tokenize,
            max_line_length=max_line_length,
            fasta=fasta,
            fasta_split_char=fasta_split_char,
            fasta_id_field=fasta_id_field,
            per_protein=per_protein,
            fasta_stop=fasta_stop,
            fasta_gaps=fasta_gaps,
        )
        return embed_corpus(self, input_file, output_file_path, options)
