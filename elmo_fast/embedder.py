"""``ElmoEmbedder``: sentences in, numpy vectors out (allennlp's ``ElmoEmbedder``), and HDF5 files."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from itertools import islice
from typing import IO, Iterable, Iterator, Sequence

import numpy as np
import torch

from .char_ids import batch_to_ids
from .errors import ElmoFastError, InputError
from .model import ElmoBiLm
from .weights import load_options

OUTPUT_FORMATS = ("all", "top", "average")


def resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ElmoFastError(f"invalid device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        how = ""
        if torch.version.cuda is None:  # the usual cause: pip's default torch wheel is CPU-only here
            from .ops import cuda_kernels_missing_reason
            how = f"; {cuda_kernels_missing_reason()}"
        raise ElmoFastError(f"device {str(dev)!r} requested, but torch sees no CUDA GPU "
                            f"(torch {torch.__version__}, torch.cuda.is_available() is False){how}")
    if dev.type not in ("cpu", "cuda"):
        raise ElmoFastError(f"device {str(dev)!r} is not supported: use 'cpu' or 'cuda[:N]'")
    return dev


def _check_sentence(sentence: object, where: str) -> None:
    if isinstance(sentence, str):
        raise InputError(f"{where}: expected a list of tokens, got a string; split it first, e.g. {sentence.split()[:3]!r}")
    if not all(isinstance(t, str) for t in sentence):  # type: ignore[union-attr]
        raise InputError(f"{where}: every token must be a str")


class ElmoEmbedder:
    """Embed tokenized sentences with a biLM given by its ``options.json`` and ``weights.hdf5``.

    backend: "auto" (the fused fast path when the extension is built, else the reference),
    "fast" or "reference". token_cache_mb bounds the cache of distinct tokens' context-free
    results kept across batches by the fast path (0 turns it off); results do not depend on it.
    dtype=torch.bfloat16 runs the fast path's GEMMs in bf16 (fp32 accumulation, fp32 cell states);
    its error bound against fp32 is stated and tested in tests/test_fast_model.py.

    Each sentence gets an array ``(3, T, 2P)``: the context-free token layer (duplicated to 2P, as
    allennlp does) and the two biLSTM layers, without the ``<S>``/``</S>`` boundaries.

    stateful=False (default) makes a sentence's vectors independent of batching; stateful=True
    carries the LSTM states from batch to batch, as allennlp and bilm-tf do.
    """

    def __init__(self, options_file: str | os.PathLike, weight_file: str | os.PathLike, device: str | torch.device = "cpu",
                 batch_size: int = 64, stateful: bool = False, backend: str = "auto",
                 token_cache_mb: float = 256.0, dtype: torch.dtype = torch.float32) -> None:
        if batch_size < 1:
            raise ElmoFastError(f"batch_size must be >= 1, got {batch_size}")
        if token_cache_mb < 0:
            raise ElmoFastError(f"token_cache_mb must be >= 0, got {token_cache_mb}")
        self.device = resolve_device(device)
        self.batch_size = batch_size
        options = load_options(options_file)
        # a cached token holds its vector [P] and its layer-0 gates [2, 4C], in fp32
        entry_bytes = 4 * (options.projection_dim + 8 * options.cell_dim)
        cache_size = int(token_cache_mb * 2**20 // entry_bytes)
        self.elmo_bilm = ElmoBiLm(options_file, weight_file, stateful=stateful, backend=backend,
                                  token_cache_size=cache_size, dtype=dtype).to(self.device).eval()
        self.output_dim = self.elmo_bilm.get_output_dim()
        self.num_layers = self.elmo_bilm.num_layers

    def _empty(self) -> np.ndarray:
        return np.zeros((self.num_layers, 0, self.output_dim), dtype=np.float32)

    @torch.inference_mode()
    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """activations [B, L + 1, T, 2P] and mask [B, T] for a batch of tokenized sentences."""
        return self.elmo_bilm.embed(batch_to_ids(batch).to(self.device))

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """One tokenized sentence -> float32 array (3, T, 2P)."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """A list of tokenized sentences -> a list of arrays (3, T_i, 2P), in order."""
        for i, s in enumerate(batch):
            _check_sentence(s, f"sentence {i} of the batch")
        if len(batch) == 0:
            return []
        # allennlp skips the model for [[]] (states untouched); stateless, any all-empty batch is zeros
        if all(len(s) == 0 for s in batch) and (len(batch) == 1 or not self.elmo_bilm.stateful):
            return [self._empty() for _ in batch]
        activations, mask = self.batch_to_embeddings(batch)
        activations = activations.float().cpu().numpy()
        lengths = mask.sum(dim=1).tolist()
        return [activations[i, :, :n] if n else self._empty() for i, n in enumerate(lengths)]

    def embed_sentences(self, sentences: Iterable[Sequence[str]], batch_size: int | None = None) -> Iterator[np.ndarray]:
        """Lazily embed an iterable of tokenized sentences, in batches, yielding in input order."""
        batch_size = batch_size or self.batch_size
        it = iter(sentences)
        while batch := list(islice(it, batch_size)):
            yield from self.embed_batch(batch)

    def embed_file(self, input_file: str | os.PathLike | IO[str], output_file_path: str | os.PathLike,
                   output_format: str = "all", batch_size: int | None = None, forget_sentences: bool = False,
                   use_sentence_keys: bool = False, progress: bool = True) -> dict[str, float]:
        """Embed a file of whitespace-tokenized sentences (one per line) into allennlp's HDF5 layout.

        One float32 dataset per line, keyed by the line's index (or by its text with
        ``use_sentence_keys``), of shape (3, T, 2P) for ``"all"`` or (T, 2P) for ``"top"`` /
        ``"average"``; plus ``sentence_to_index``, a JSON map from each line's text to its key. The
        file is written under a temporary name and renamed when complete, so an interrupted run
        leaves no partial output. Returns counts and timings.
        """
        if output_format not in OUTPUT_FORMATS:
            raise ElmoFastError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, got {output_format!r}")
        sentences = read_sentences(input_file)
        output_file_path = os.fspath(output_file_path)
        out_dir = os.path.dirname(os.path.abspath(output_file_path))
        if not os.path.isdir(out_dir):
            raise ElmoFastError(f"{output_file_path}: the output's directory {out_dir} does not exist")
        if use_sentence_keys:
            seen: set[str] = set()
            for i, s in enumerate(sentences):
                if s in seen:
                    raise InputError(f"line {i + 1} repeats an earlier sentence; its key would exist twice in "
                                     f"{output_file_path}: do not pass use_sentence_keys to encode duplicate sentences")
                seen.add(s)
        return _write_hdf5(self, sentences, output_file_path, output_format, batch_size or self.batch_size,
                           forget_sentences, use_sentence_keys, progress)


def read_sentences(input_file: str | os.PathLike | IO[str]) -> list[str]:
    """Stripped lines of an input file; an empty (or all-whitespace) line is an error naming it."""
    if isinstance(input_file, (str, os.PathLike)):
        name = os.fspath(input_file)
        try:
            with open(name, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            raise InputError(f"{name}: input file not found") from None
        except UnicodeDecodeError as e:
            raise InputError(f"{name}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    else:
        name = getattr(input_file, "name", "<input>")
        lines = input_file.readlines()
    sentences = [line.strip() for line in lines]
    blank = [i + 1 for i, s in enumerate(sentences) if not s]
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (" ..." if len(blank) > 10 else "")
        raise InputError(f"{name}: line {shown} {'is' if len(blank) == 1 else 'are'} empty; "
                         f"every line must hold one whitespace-tokenized sentence")
    if not sentences:
        raise InputError(f"{name}: the input holds no sentences")
    return sentences


def _write_hdf5(embedder: ElmoEmbedder, sentences: list[str], output_file_path: str, output_format: str,
                batch_size: int, forget_sentences: bool, use_sentence_keys: bool, progress: bool) -> dict[str, float]:
    import h5py
    from tqdm import tqdm

    out_dir = os.path.dirname(os.path.abspath(output_file_path))
    fd, tmp_path = tempfile.mkstemp(prefix="." + os.path.basename(output_file_path) + ".", suffix=".partial", dir=out_dir)
    os.close(fd)
    start = time.perf_counter()
    n_tokens = 0
    try:
        with h5py.File(tmp_path, "w") as fout:
            split = (s.split() for s in sentences)
            bar = tqdm(total=len(sentences), unit="sent", disable=not progress, file=sys.stderr, dynamic_ncols=True)
            sentence_to_index: dict[str, str] = {}
            for i, embeddings in enumerate(embedder.embed_sentences(split, batch_size)):
                key = sentences[i] if use_sentence_keys else str(i)
                if not forget_sentences and not use_sentence_keys:
                    sentence_to_index[sentences[i]] = key
                if output_format == "all":
                    output = embeddings
                elif output_format == "top":
                    output = embeddings[-1]
                else:
                    output = np.average(embeddings, axis=0)
                fout.create_dataset(key, output.shape, dtype="float32", data=output)
                n_tokens += embeddings.shape[1]
                bar.update(1)
            bar.close()
            if not forget_sentences and not use_sentence_keys:
                ds = fout.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
                ds[0] = json.dumps(sentence_to_index)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes it 0600; give it a normal file's mode
        os.replace(tmp_path, output_file_path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise
    seconds = time.perf_counter() - start
    stats = {"sentences": len(sentences), "tokens": n_tokens, "seconds": seconds,
             "tokens_per_s": n_tokens / seconds if seconds > 0 else float("inf")}
    if progress:
        print(f"elmo-fast: embedded {len(sentences)} sentences ({n_tokens} tokens) in {seconds:.2f} s: "
              f"{stats['tokens_per_s']:.0f} tokens/s, {len(sentences) / seconds:.1f} sentences/s -> {output_file_path}",
              file=sys.stderr)
    return stats
