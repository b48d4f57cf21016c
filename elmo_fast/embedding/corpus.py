"""Corpus-scale ``embed_file``: streamed input, length bucketing, crash-safe output, resume.

Lines are read lazily and checked as they arrive. A bounded window of sentences is read ahead,
sorted by length and cut into batches under a token budget; every result goes to disk as soon as
its batch is done, so memory does not grow with the corpus (only ``sentence_to_index``, one JSON
string in allennlp's layout, is built whole at the end). Two ways to write:

* plain (default): one HDF5 file under a temporary name beside the output, renamed into place
  when complete; any failure removes it.
* resumable (``resume=True``): a work directory ``OUTPUT.partial/`` holding a manifest and one
  shard file per window, each written under a temporary name, fsync'ed and renamed, so a shard
  that exists is complete whatever moment the process was killed at; a half-written HDF5 file is
  never reopened. A later ``resume=True`` run reads the input again, checks each shard's lines
  against a digest, embeds the rest and assembles the final file (needing room for the output
  twice until then).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import islice
from typing import IO, Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np
import torch

from ..bilm.model import ElmoBiLm
from ..errors import ElmoFastError, InputError


class ElmoEmbedder(Protocol):
    """What the corpus machinery needs of an embedder (:class:`elmo_fast.ElmoEmbedder` is one): it
    embeds batches; this module streams, batches, writes and resumes around it."""

    elmo_bilm: ElmoBiLm
    device: torch.device
    batch_size: int
    #: the files that define the model, by role ("options" and "weights" for bilm-tf models)
    model_files: dict[str, str | os.PathLike]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]: ...

OUTPUT_FORMATS = ("all", "top", "average")
ENCODING_ERRORS = ("strict", "replace")
#: padded tokens (sentences x longest) per batch when bucketing, unless told otherwise: at the
#: default batch size of 64 it only binds for sentences over 64 tokens, and bounds the memory of a
#: batch of long ones (the largest activations on `original`: 4096 x 3 x 1024 x 4 bytes = 50 MB)
DEFAULT_MAX_TOKENS = 4096
#: sentences read ahead and sorted together; with resume, also the work saved at once
DEFAULT_WINDOW = 2048
MANIFEST = "manifest.json"
#: root attribute of a file assembled by resume=True: its run's manifest and shard digests, so that
#: resuming a run that was killed after it finished (its work directory gone) is recognised as done
RUN_RECORD = "elmo_fast_run"
_MANIFEST_VERSION = 1
# lone surrogates: what surrogateescape makes of bytes that are not UTF-8
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass
class Line:
    """One sentence of the input: its 0-based line number (its default key) and its text."""
    index: int
    text: str
    tokens: list[str]


def _open_text(input_file: str | os.PathLike | IO) -> tuple[str, IO[str], bool]:
    """(name for messages, a text stream whose undecodable bytes are kept as surrogates, whether
    the caller must detach it from a binary stream it does not own)."""
    if isinstance(input_file, (str, os.PathLike)):
        name = os.fspath(input_file)
        try:
            # surrogateescape: a bad byte must not stop the read; the line that holds it is named below
            return name, open(name, encoding="utf-8", errors="surrogateescape"), False
        except FileNotFoundError:
            raise InputError(f"{name}: input file not found") from None
        except OSError as e:
            raise InputError(f"{name}: cannot read the input: {e.strerror or e}") from None
    name = str(getattr(input_file, "name", "<input>"))
    if isinstance(input_file, (io.RawIOBase, io.BufferedIOBase)):
        return name, io.TextIOWrapper(input_file, encoding="utf-8", errors="surrogateescape"), True
    return name, input_file, False


def _decode_line(raw: str, name: str, number: int, encoding_errors: str) -> str:
    if not _SURROGATES.search(raw):
        return raw
    try:
        data = raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a str stream handed to us with lone surrogates: no bytes to recover
        raise InputError(f"{name}: line {number} holds a lone surrogate, which UTF-8 cannot encode") from None
    if encoding_errors == "replace":
        return data.decode("utf-8", "replace")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: line {number} is not valid UTF-8 ({e.reason} at byte {e.start} of the line); "
                         f"fix it, or pass --encoding-errors replace to read bad bytes as U+FFFD") from None
    return raw  # unreachable in practice: surrogates only come from bytes that are not UTF-8


def read_sentences(input_file: str | os.PathLike | IO, encoding_errors: str = "strict",
                   skip_empty: bool = False) -> Iterator[Line]:
    """Lazily the input's sentences, one per line, stripped, checked as they are read.

    input_file: a path, a binary stream (decoded as UTF-8 line by line) or a text stream; a path is
    opened now, so that a missing file fails before any output is begun. A line that is not UTF-8
    is an error naming it (``encoding_errors="replace"`` reads bad bytes as U+FFFD instead); so is
    an empty or all-whitespace line, unless ``skip_empty``, which skips it and keeps the line
    numbers of the others (their keys). An input with no sentence is an error.
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise ElmoFastError(f"encoding_errors must be one of {', '.join(ENCODING_ERRORS)}, got {encoding_errors!r}")
    name, stream, detach = _open_text(input_file)
    return _iter_lines(name, stream, detach, isinstance(input_file, (str, os.PathLike)), encoding_errors, skip_empty)


def _iter_lines(name: str, stream: IO[str], detach: bool, close: bool, encoding_errors: str,
                skip_empty: bool) -> Iterator[Line]:
    count = 0
    try:
        for index, raw in enumerate(stream):
            text = _decode_line(raw, name, index + 1, encoding_errors).strip()
            if not text:
                if skip_empty:
                    continue
                raise InputError(f"{name}: line {index + 1} is empty; every line must hold one whitespace-tokenized "
                                 f"sentence (--skip-empty skips such lines)")
            count += 1
            yield Line(index, text, text.split())
        if count == 0:
            raise InputError(f"{name}: the input holds no sentences")
    finally:
        if detach:
            stream.detach()  # type: ignore[attr-defined]  (leave the caller's binary stream open)
        elif close:
            stream.close()


def _count_lines(path: str) -> int | None:
    """Lines in a regular file (one fast pass over its bytes), for the progress bar's total."""
    try:
        if not os.path.isfile(path):
            return None
        n, last = 0, b"\n"
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                n += chunk.count(b"\n")
                last = chunk[-1:]
        return n + (last != b"\n")
    except OSError:
        return None


def _refuse_duplicates(lines: Iterable[Line], output: str) -> Iterator[Line]:
    """With sentence keys a repeated sentence would need one key twice: an error naming both lines.
    Holds a 16-byte digest per sentence seen, not the sentences."""
    seen: dict[bytes, int] = {}
    for line in lines:
        digest = hashlib.blake2b(line.text.encode("utf-8"), digest_size=16).digest()
        first = seen.setdefault(digest, line.index)
        if first != line.index:
            raise InputError(f"line {line.index + 1} repeats the sentence of line {first + 1}; its key would exist "
                             f"twice in {output}: do not pass use_sentence_keys to encode duplicate sentences")
        yield line


def cut_batches(lines: Sequence[Line], batch_size: int, max_tokens: int | None) -> list[list[Line]]:
    """Consecutive batches of at most batch_size sentences and at most max_tokens padded tokens
    (sentences x longest); a sentence longer than the budget gets a batch of its own."""
    return list(_iter_batches(lines, batch_size, lambda: max_tokens))


def _iter_batches(lines: Sequence[Line], batch_size: int, budget: Callable[[], int | None]) -> Iterator[list[Line]]:
    # the budget is read batch by batch: after an out-of-memory it shrinks for the rest of the window
    batch: list[Line] = []
    longest = 0
    for line in lines:
        n = max(len(line.tokens), 1)
        max_tokens = budget()
        over_budget = max_tokens is not None and (len(batch) + 1) * max(longest, n) > max_tokens
        if batch and (len(batch) == batch_size or over_budget):
            yield batch
            batch, longest = [], 0
        batch.append(line)
        longest = max(longest, n)
    if batch:
        yield batch


def _is_out_of_memory(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    # CPU allocators report failure as a plain RuntimeError ("DefaultCPUAllocator: can't allocate memory")
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(s in text for s in ("can't allocate memory", "cannot allocate memory",
                                                                   "out of memory", "not enough memory"))


def write_float32(group, key: str, data: np.ndarray) -> None:
    """``group[key] = data`` as a float32 dataset (the layout h5py's ``create_dataset`` makes), through
    h5py's low-level API: 2.3x faster per dataset, which shows with one small dataset per sentence."""
    import h5py

    data = np.ascontiguousarray(data, dtype=np.float32)
    name = key.encode("utf-8")
    try:
        if b"/" in name.lstrip(b"/"):  # as create_dataset: a sentence key "a / b" is dataset " b" in group "a "
            parent, name = name.rsplit(b"/", 1)
            group = group.require_group(parent)
        dataset = h5py.h5d.create(group.id, name, h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(data.shape))
    except (ValueError, TypeError) as e:  # only sentence keys can be such names: line indices always fit
        raise InputError(f"the sentence {key!r} cannot be a dataset name in HDF5 ({e}): with use_sentence_keys "
                         "'/' nests groups, so '.', a trailing '/', or a sentence that is another's group path "
                         "cannot be stored; do not pass use_sentence_keys (--use-sentence-keys) for this input") from None
    if data.size:
        dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, data)


class _BatchRunner:
    """Embeds a batch of lines, halving it on out-of-memory until the halves fit."""

    def __init__(self, embedder: ElmoEmbedder, output_format: str, max_tokens: int | None) -> None:
        self.embedder = embedder
        self.stateful = embedder.elmo_bilm.stateful
        self.output_format = output_format
        self.max_tokens = max_tokens
        self.oom_splits = 0

    def outputs(self, batch: list[Line]) -> list[np.ndarray]:
        failure = None
        try:
            results = self.embedder.embed_batch([line.tokens for line in batch])
        except Exception as e:  # noqa: BLE001  (only out-of-memory is handled; anything else is re-raised)
            if not _is_out_of_memory(e):
                raise
            failure = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if failure is None:
            return [self._format(r) for r in results]
        # out of the except block: the traceback no longer pins the failed batch's tensors
        if self.embedder.device.type == "cuda":
            torch.cuda.empty_cache()
        padded = len(batch) * max(len(line.tokens) for line in batch)
        where = (f"line {batch[0].index + 1}" if len(batch) == 1
                 else f"the batch of lines {min(l.index for l in batch) + 1}..{max(l.index for l in batch) + 1}")
        if self.stateful:
            # halves would run as two batches, so rows would take other rows' states: not the same run
            raise InputError(f"{where} ({len(batch)} sentences, {padded} padded tokens) does not fit in memory on "
                             f"{self.embedder.device} ({failure}); stateful mode cannot split a batch: pass a "
                             f"smaller --batch-size")
        if len(batch) == 1:
            raise InputError(f"line {batch[0].index + 1}: its sentence of {len(batch[0].tokens)} tokens does not fit "
                             f"in memory on {self.embedder.device} even alone ({failure})")
        self.oom_splits += 1
        # later batches stay under what failed, instead of failing and splitting again one by one
        self.max_tokens = min(self.max_tokens or padded, max(1, padded // 2))
        mid = len(batch) // 2
        return self.outputs(batch[:mid]) + self.outputs(batch[mid:])

    def _format(self, embeddings: np.ndarray) -> np.ndarray:
        if self.output_format == "all":
            return embeddings
        if self.output_format == "top":
            return embeddings[-1]
        return np.average(embeddings, axis=0)


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_readable(path: str) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp makes files 0600; the output gets a normal file's mode


def _sentence_map(pairs: Iterable[tuple[str, str]]) -> str:
    # allennlp's dict: a repeated sentence keeps its first position and takes its last key
    return json.dumps(dict(pairs))


def _write_sentence_map(fout, pairs: Iterable[tuple[str, str]]) -> None:
    import h5py

    ds = fout.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
    ds[0] = _sentence_map(pairs)


class _PlainWriter:
    """One HDF5 file under a temporary name beside the output, renamed into place when complete."""

    def __init__(self, output: str, keep_sentences: bool) -> None:
        import h5py

        out_dir = os.path.dirname(os.path.abspath(output))
        base = os.path.basename(output)
        self.output = output
        fd, self.tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".partial", dir=out_dir)
        os.close(fd)
        self.spill_path: str | None = None
        self.spill: IO[str] | None = None
        self.h5 = None
        try:
            self.h5 = h5py.File(self.tmp, "w")
            if keep_sentences:
                # sentence_to_index needs every sentence: kept on disk until the end, not in memory
                fd, self.spill_path = tempfile.mkstemp(prefix=f".{base}.", suffix=".sentences", dir=out_dir)
                self.spill = os.fdopen(fd, "w", encoding="utf-8")
        except BaseException:
            self.abort()
            raise

    def put(self, position: int, key: str, data: np.ndarray) -> None:
        write_float32(self.h5, key, data)

    def window_done(self, window: list[Line], keys: list[str], states) -> None:
        if self.spill is not None:
            for line, key in zip(window, keys):
                self.spill.write(json.dumps([line.text, key]) + "\n")

    def finish(self) -> None:
        if self.spill is not None:
            self.spill.close()
            with open(self.spill_path, encoding="utf-8") as f:
                _write_sentence_map(self.h5, (tuple(json.loads(row)) for row in f))
        self.h5.close()
        _fsync_path(self.tmp)
        _make_readable(self.tmp)
        os.replace(self.tmp, self.output)
        if self.spill_path:
            os.unlink(self.spill_path)

    def abort(self) -> None:
        for close in (self.spill, self.h5):
            try:
                if close is not None:
                    close.close()
            except Exception:  # noqa: BLE001  (already failing: removing the files matters more)
                pass
        for path in (self.tmp, self.spill_path):
            if path:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def work_dir_of(output: str) -> str:
    return os.path.abspath(output) + ".partial"


def _lines_digest(lines: Iterable[Line]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for line in lines:
        h.update(f"{line.index}\t{line.text}\n".encode("utf-8"))
    return h.hexdigest()


def _file_digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _write_json_atomic(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(os.path.dirname(path), directory=True)


def _read_manifest(work: str) -> dict | None:
    path = os.path.join(work, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # written atomically, so only a hand edit or a bad disk gets here
        raise ElmoFastError(f"{path} is unreadable ({e}); remove {work} to start over") from None


def _differences(then: dict, now: dict) -> list[str]:
    # the input's name may change (a moved file, stdin): its lines are checked against digests instead
    return [f"{k}: {then.get(k)!r} then, {now.get(k)!r} now" for k in sorted(now)
            if k not in ("input", "complete") and then.get(k) != now.get(k)]


def _run_record(output: str) -> dict | None:
    import h5py

    try:
        with h5py.File(output, "r") as f:
            return json.loads(f.attrs[RUN_RECORD]) if RUN_RECORD in f.attrs else None
    except (OSError, ValueError, TypeError):
        return None


def _finished_run_differs(record: dict, manifest: dict, lines: Iterator[Line], name: str) -> str | None:
    """Why the finished run recorded in an output is not this one (None: it is, input included)."""
    differs = _differences(record, manifest)
    if differs:
        return "; ".join(differs)
    for n, digest in record["shards"]:
        got = list(islice(lines, n))
        if len(got) < n:
            return f"{name} has fewer lines than the input it was made from"
        if _lines_digest(got) != digest:
            return f"lines {got[0].index + 1}..{got[-1].index + 1} of {name} are not those it was made from"
    extra = next(lines, None)
    return f"{name} has more lines than it was made from (line {extra.index + 1})" if extra else None


def _is_ours(name: str) -> bool:
    return (name.startswith("shard-") and (name.endswith(".h5") or name.endswith(".h5.tmp"))
            or name in (MANIFEST, MANIFEST + ".tmp", "assembling.h5"))


def remove_work_dir(work: str) -> None:
    """Delete a work directory: shards first, the manifest last, so that a directory that still
    has a manifest always has every shard it had (a kill in the middle leaves a void directory)."""
    names = os.listdir(work)
    strangers = [n for n in names if not _is_ours(n)]
    if strangers:
        raise ElmoFastError(f"{work} holds files elmo-fast did not write ({', '.join(sorted(strangers)[:3])}); "
                            f"move them away or pick another output name")
    for n in sorted(names, key=lambda n: n == MANIFEST):
        os.unlink(os.path.join(work, n))
    os.rmdir(work)


def _shard_names(work: str) -> list[str]:
    return sorted(n for n in os.listdir(work) if n.startswith("shard-") and n.endswith(".h5"))


class _ShardWriter:
    """Work directory OUTPUT.partial/: a manifest, then one complete shard file per window."""

    def __init__(self, output: str, manifest: dict) -> None:
        self.output = output
        self.work = work_dir_of(output)
        self.manifest = manifest
        self.shards: list[dict] = []  # attrs of the complete shards, in order
        self.h5 = None
        self.tmp: str | None = None
        existing = _read_manifest(self.work) if os.path.isdir(self.work) else None
        if existing is None:
            if os.path.isdir(self.work):
                remove_work_dir(self.work)  # a void leftover (killed while created or torn down)
            os.mkdir(self.work)
            _write_json_atomic(os.path.join(self.work, MANIFEST), manifest)
            return
        differs = _differences(existing, manifest)
        if differs:
            raise ElmoFastError(f"cannot resume {self.work}: the interrupted run differs ({'; '.join(differs)}); rerun "
                                f"with its settings, or remove {self.work} to start over")
        self.manifest = existing
        if self.complete:  # the assembled file is final; shards may be half deleted already
            return
        for n in os.listdir(self.work):
            if n.endswith(".tmp") or n == "assembling.h5":
                os.unlink(os.path.join(self.work, n))  # cut short by the kill: redone below
        for i, n in enumerate(_shard_names(self.work)):
            if n != f"shard-{i:06d}.h5":
                raise ElmoFastError(f"{self.work}: shard {n} is out of sequence (expected shard-{i:06d}.h5); remove "
                                    f"{self.work} to start over")
            self.shards.append(self._shard_attrs(os.path.join(self.work, n)))

    @staticmethod
    def _shard_attrs(path: str) -> dict:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                return {"path": path, "n": int(f.attrs["n"]), "digest": str(f.attrs["digest"]),
                        "first_line": int(f.attrs["first_line"]), "last_line": int(f.attrs["last_line"])}
        except (OSError, KeyError) as e:  # renamed only once complete and fsync'ed: a damaged disk
            raise ElmoFastError(f"{path} is unreadable ({e}); remove its directory to start over") from None

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def skip_done(self, lines: Iterator[Line], name: str) -> tuple[int, int]:
        """Read past the input's lines that complete shards hold, checking that they are the same.
        Returns (sentences, lines) done."""
        for shard in self.shards:
            got = list(islice(lines, shard["n"]))
            if len(got) < shard["n"] or _lines_digest(got) != shard["digest"]:
                raise InputError(f"{name}: lines {shard['first_line'] + 1}..{shard['last_line'] + 1} are not those "
                                 f"the interrupted run embedded into {os.path.basename(shard['path'])} (the input "
                                 f"changed since); remove {self.work} to start over")
        done = sum(s["n"] for s in self.shards)
        return done, (self.shards[-1]["last_line"] + 1 if self.shards else 0)

    def saved_states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        import h5py

        if not self.shards:
            return None
        with h5py.File(self.shards[-1]["path"], "r") as f:
            if "state_h" not in f:
                return None
            return torch.from_numpy(f["state_h"][...]), torch.from_numpy(f["state_c"][...])

    def _open(self) -> None:
        import h5py

        self.tmp = os.path.join(self.work, f"shard-{len(self.shards):06d}.h5.tmp")
        self.h5 = h5py.File(self.tmp, "w")
        self.h5.create_group("v")

    def put(self, position: int, key: str, data: np.ndarray) -> None:
        if self.h5 is None:
            self._open()
        # by position in the window: keys (sentences with sentence keys) can be any text
        write_float32(self.h5["v"], str(position), data)

    def window_done(self, window: list[Line], keys: list[str], states) -> None:
        import h5py

        if self.h5 is None:
            self._open()
        f = self.h5
        f.create_dataset("lines", data=np.array([line.index for line in window], dtype=np.int64))
        f.create_dataset("text", data=[line.text for line in window], dtype=h5py.string_dtype())
        if states is not None:
            f.create_dataset("state_h", data=states[0].float().cpu().numpy())
            f.create_dataset("state_c", data=states[1].float().cpu().numpy())
        attrs = {"n": len(window), "digest": _lines_digest(window), "first_line": window[0].index,
                 "last_line": window[-1].index}
        f.attrs.update(attrs)
        f.close()
        self.h5 = None
        _fsync_path(self.tmp)
        final = self.tmp[: -len(".tmp")]
        os.replace(self.tmp, final)  # its presence now says: these sentences are done
        _fsync_path(self.work, directory=True)
        self.shards.append({**attrs, "path": final})

    def finish(self) -> None:
        import h5py

        assembling = os.path.join(self.work, "assembling.h5")
        if not self.complete:
            use_keys = self.manifest["use_sentence_keys"]
            keep = not use_keys and not self.manifest["forget_sentences"]
            pairs: list[tuple[str, str]] = []
            with h5py.File(assembling, "w") as fout:
                for shard in self.shards:
                    with h5py.File(shard["path"], "r") as f:
                        texts = f["text"].asstr()[...]
                        lines = f["lines"][...]
                        vectors = f["v"]
                        for j, (index, text) in enumerate(zip(lines, texts)):
                            key = text if use_keys else str(int(index))
                            data = vectors[str(j)][...]
                            write_float32(fout, key, data)
                            if keep:
                                pairs.append((text, key))
                if keep:
                    _write_sentence_map(fout, pairs)
                record = {k: v for k, v in self.manifest.items() if k != "complete"}
                fout.attrs[RUN_RECORD] = json.dumps({**record, "shards": [[s["n"], s["digest"]] for s in self.shards]})
            _fsync_path(assembling)
            _make_readable(assembling)
            # from here the assembled file is final: a kill before the rename is finished by --resume
            self.manifest = {**self.manifest, "complete": True}
            _write_json_atomic(os.path.join(self.work, MANIFEST), self.manifest)
        if os.path.exists(assembling):
            os.replace(assembling, self.output)
            _fsync_path(os.path.dirname(os.path.abspath(self.output)), directory=True)
        remove_work_dir(self.work)

    def abort(self) -> None:
        # complete shards stay for --resume; only the window in progress is lost
        if self.h5 is not None:
            try:
                self.h5.close()
            except Exception:  # noqa: BLE001
                pass
            self.h5 = None
        if self.tmp and os.path.exists(self.tmp):
            os.unlink(self.tmp)
        if not self.shards and os.path.isdir(self.work):
            remove_work_dir(self.work)  # nothing done worth resuming: leave nothing behind


def check_output(output: str, overwrite: bool, resume: bool) -> None:
    """Refuse, before any work, an output that cannot or should not be written."""
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        raise ElmoFastError(f"{output}: the output's directory {out_dir} does not exist")
    if os.path.isdir(output):
        raise ElmoFastError(f"{output} is a directory; give the path of the HDF5 file to write")
    work = work_dir_of(output)
    if os.path.isdir(work):
        if _read_manifest(work) is not None:
            if not resume:
                n = len(_shard_names(work))
                raise ElmoFastError(f"{work} holds an interrupted run ({n} window(s) done); pass --resume to continue "
                                    f"it, or remove that directory to start over")
            return  # the run that made it passed the checks below; it may replace the output
    if os.path.exists(output) and not overwrite:
        if resume and _run_record(output) is not None:
            return  # made by a resume run that finished; embed_corpus checks that it was this one
        raise ElmoFastError(f"{output} already exists; pass --overwrite to replace it")


def _model_identity(embedder: ElmoEmbedder) -> dict:
    bilm = embedder.elmo_bilm
    return {**{role: _file_digest(os.fspath(path)) for role, path in embedder.model_files.items()},
            "backend": bilm.backend, "dtype": str(bilm.compute_dtype), "device": embedder.device.type}


_NOTHING_DONE = {"sentences": 0, "tokens": 0, "seconds": 0.0, "tokens_per_s": 0.0, "resumed_sentences": 0,
                 "oom_splits": 0}


def _finished_already(output: str, manifest: dict, lines: Iterator[Line], name: str, overwrite: bool,
                      rereadable: bool) -> bool:
    """Whether the output is the finished result of this very run (resume=True after the work directory
    was removed), reading the input to check it; an output of another run is an error unless overwrite."""
    work = work_dir_of(output)
    if not os.path.isfile(output) or os.path.isdir(work) and _read_manifest(work) is not None:
        return False
    record = _run_record(output)
    if record is None:
        return False
    why = _finished_run_differs(record, manifest, lines, name)
    if why is None:
        return True
    if not overwrite:
        raise ElmoFastError(f"{output} already exists, made by another run ({why}); pass --overwrite to replace it")
    if not rereadable:
        raise ElmoFastError(f"{output} was made by another run ({why}), and {name} cannot be read twice; "
                            f"remove {output} to embed it")
    return False


def embed_corpus(embedder: ElmoEmbedder, input_file: str | os.PathLike | IO, output_file_path: str | os.PathLike,
                 output_format: str = "all", batch_size: int | None = None, forget_sentences: bool = False,
                 use_sentence_keys: bool = False, progress: bool = True, *, max_tokens_per_batch: int | None = None,
                 bucketing: bool | None = None, window: int = DEFAULT_WINDOW, resume: bool = False,
                 overwrite: bool = True, skip_empty: bool = False, encoding_errors: str = "strict") -> dict[str, float]:
    """The body of :meth:`ElmoEmbedder.embed_file` (see there)."""
    from tqdm import tqdm

    output = os.fspath(output_file_path)
    stateful = embedder.elmo_bilm.stateful
    batch_size = batch_size or embedder.batch_size
    if output_format not in OUTPUT_FORMATS:
        raise ElmoFastError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, got {output_format!r}")
    if encoding_errors not in ENCODING_ERRORS:
        raise ElmoFastError(f"encoding_errors must be one of {', '.join(ENCODING_ERRORS)}, got {encoding_errors!r}")
    for what, value in (("batch_size", batch_size), ("max_tokens_per_batch", max_tokens_per_batch), ("window", window)):
        if value is not None and value < 1:
            raise ElmoFastError(f"{what} must be >= 1, got {value}")
    if stateful:
        if max_tokens_per_batch is not None or bucketing:
            raise ElmoFastError("stateful mode keeps input order (the LSTM states flow from each batch to the next), so "
                                "it cannot sort sentences into batches by length: drop --max-tokens-per-batch and "
                                "bound batches with --batch-size")
        bucketing, max_tokens = False, None
        window = -(-window // batch_size) * batch_size  # whole batches, so a resumed run cuts the same ones
    else:
        bucketing = True if bucketing is None else bucketing
        max_tokens = max_tokens_per_batch if max_tokens_per_batch is not None else (
            DEFAULT_MAX_TOKENS if bucketing else None)
    check_output(output, overwrite, resume)
    if embedder.device.type == "cuda" and embedder.elmo_bilm.backend == "fast":
        from ..bilm.ops import require_cuda_kernels

        require_cuda_kernels()  # now, not at the first batch after the output was begun
    name = (os.fspath(input_file) if isinstance(input_file, (str, os.PathLike))
            else str(getattr(input_file, "name", "<input>")))
    lines: Iterator[Line] = read_sentences(input_file, encoding_errors, skip_empty)
    if use_sentence_keys:
        lines = _refuse_duplicates(lines, output)
    keep_sentences = not forget_sentences and not use_sentence_keys

    writer: _PlainWriter | _ShardWriter
    done_sentences = done_lines = 0
    if resume:
        manifest = {"version": _MANIFEST_VERSION, "input": name, "output_format": output_format,
                    "use_sentence_keys": use_sentence_keys, "forget_sentences": forget_sentences,
                    "stateful": stateful, "batch_size": batch_size if stateful else None, **_model_identity(embedder)}
        rereadable = isinstance(input_file, (str, os.PathLike))
        if _finished_already(output, manifest, lines, name, overwrite, rereadable):
            if progress:
                print(f"elmo-fast: {output} is complete already: nothing to resume", file=sys.stderr)
            return dict(_NOTHING_DONE)
        if rereadable:
            lines = read_sentences(input_file, encoding_errors, skip_empty)  # from the start again, if it was read
            if use_sentence_keys:
                lines = _refuse_duplicates(lines, output)
        writer = _ShardWriter(output, manifest)
        if writer.complete:  # killed between assembling the file and renaming it: finish that
            writer.finish()
            return dict(_NOTHING_DONE)
    else:
        writer = _PlainWriter(output, keep_sentences)
    runner = _BatchRunner(embedder, output_format, max_tokens)
    total = _count_lines(name) if isinstance(input_file, (str, os.PathLike)) else None
    start = time.perf_counter()
    n_sentences = n_tokens = 0
    try:
        if isinstance(writer, _ShardWriter):
            done_sentences, done_lines = writer.skip_done(lines, name)
            if stateful and (states := writer.saved_states()) is not None:
                embedder.elmo_bilm.set_states(states)
        with tqdm(total=total, initial=done_lines, unit="line", disable=not progress, file=sys.stderr,
                  dynamic_ncols=True) as bar:
            while chunk := list(islice(lines, window)):
                order = sorted(chunk, key=lambda line: (len(line.tokens), line.index)) if bucketing else chunk
                position = {id(line): j for j, line in enumerate(chunk)}
                keys = [line.text if use_sentence_keys else str(line.index) for line in chunk]
                for batch in _iter_batches(order, batch_size, lambda: runner.max_tokens):
                    for line, data in zip(batch, runner.outputs(batch)):
                        j = position[id(line)]
                        writer.put(j, keys[j], data)
                        n_tokens += len(line.tokens)
                    bar.update(len(batch))
                bar.update(chunk[-1].index + 1 - bar.n)  # lines skipped as empty count as read
                writer.window_done(chunk, keys, embedder.elmo_bilm.get_states() if stateful else None)
                n_sentences += len(chunk)
            if total is not None and bar.n < total:
                bar.update(total - bar.n)
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    seconds = time.perf_counter() - start
    stats = {"sentences": n_sentences, "tokens": n_tokens, "seconds": seconds,
             "tokens_per_s": n_tokens / seconds if seconds > 0 else float("inf"),
             "resumed_sentences": done_sentences, "oom_splits": runner.oom_splits}
    if progress:
        resumed = f" (after {done_sentences} done before)" if done_sentences else ""
        print(f"elmo-fast: embedded {n_sentences} sentences ({n_tokens} tokens){resumed} in {seconds:.2f} s: "
              f"{stats['tokens_per_s']:.0f} tokens/s, {n_sentences / seconds:.1f} sentences/s -> {output}",
              file=sys.stderr)
    return stats
