"""Corpus-scale ``embed_file``: streamed input, length bucketing, crash-safe output, resume.

Lines are read lazily and checked as they arrive. A bounded window of sentences is read ahead,
sorted by length and cut into batches under a token budget; every result goes to disk as soon as
its batch is done, so memory does not grow with the corpus (only ``sentence_to_index``, one JSON
string in allennlp's layout, is built whole at the end). Two ways to write:

* plain (default): one HDF5 file under a temporary name beside the output, renamed into place
  when complete; any failure, Ctrl-C or (through the CLI's handlers) SIGTERM or SIGHUP removes
  it. The names (``.OUTPUT.HOST-PID.TOKEN.partial`` and ``.sentences``) say which process made
  them, so that a later run removes those of a process that is gone (``kill -9`` runs no cleanup)
  and leaves those of a live one.
* resumable (``resume=True``): a work directory ``OUTPUT.partial/`` holding a manifest and one
  shard file per window, each written under a temporary name, fsync'ed and renamed, so a shard
  that exists is complete whatever moment the process was killed at; a half-written HDF5 file is
  never reopened. A shard is named after the position of its first sentence in the input, so
  that any number of processes can write them. A later ``resume=True`` run reads the input again,
  checks each shard's lines against a digest, embeds the windows between them and assembles the
  final file, copying each dataset once with HDF5's own H5Ocopy (needing room for the output twice
  until then).
* a group (``distributed=True``, ``torchrun``): the resumable way, each rank embedding its share
  of the windows into the same work directory, rank 0 assembling (see :mod:`.ranks`).

The input may be plain, gzip, bzip2 or xz text, told apart by its first bytes; the progress bar
counts tokens, its total counted by a background pass over the file.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from itertools import islice
from typing import IO, Any, Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np
import torch

from ..bilm.model import ElmoBiLm
from ..errors import ElmoFastError, InputError, Param
from ..textio import BOM, DECOMPRESSION_ERRORS, TextInput


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
# 2: shards named and recorded by the position of their first sentence (any number of ranks write them)
_MANIFEST_VERSION = 2
# lone surrogates: what surrogateescape makes of bytes that are not UTF-8
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass
class Line:
    """One sentence of the input: its 0-based line number (its default key) and its text."""
    index: int
    text: str
    tokens: list[str]


def _decode_line(raw: str, name: str, number: int, encoding_errors: str, compression: str | None) -> str:
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
        where = f"{name}: line {number}" + (f" (after {compression} decompression)" if compression else "")
        if compression:  # not text inside (a tar archive?): reading it with U+FFFD would embed garbage
            raise InputError(f"{where} is not valid UTF-8 ({e.reason} at byte {e.start} of the line); the "
                             f"decompressed data must be UTF-8 text, one sentence per line (is the file damaged, "
                             f"or an archive?)") from None
        raise InputError(f"{where} is not valid UTF-8 ({e.reason} at byte {e.start} of the line); fix it, or pass ",
                         Param("encoding_errors", "replace"), " to read bad bytes as U+FFFD") from None
    return raw  # unreachable in practice: surrogates only come from bytes that are not UTF-8


def read_sentences(input_file: str | os.PathLike | IO, encoding_errors: str = "strict",
                   skip_empty: bool = False, tokenize: bool = False) -> Iterator[Line]:
    """Lazily the input's sentences, one per line, stripped, checked as they are read.

    input_file: a path, a binary stream (decoded as UTF-8 line by line) or a text stream; a path is
    opened now, so that a missing file fails before any output is begun. Paths and binary streams
    compressed with gzip, bzip2 or xz are decompressed, recognised by their first bytes whatever
    their name. A byte-order mark at the start of the input is dropped (as ``utf-8-sig`` does).
    A line that is not UTF-8 is an error naming it (``encoding_errors="replace"`` reads bad bytes
    as U+FFFD instead), as is a line holding a NUL byte (binary data, not text); so is an empty or
    all-whitespace line, unless ``skip_empty``, which skips it and keeps the line numbers of the
    others (their keys). An input with no sentence is an error. Tokens are the line split at
    whitespace, or with ``tokenize`` the tokens of :func:`elmo_fast.tokenizer.tokenize_line` (raw
    text, tokenized as the bundled model's training corpus was); the line's text stays its key.
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise ElmoFastError(Param("encoding_errors"), f" must be one of {', '.join(ENCODING_ERRORS)}, "
                            f"got {encoding_errors!r}")
    return _iter_lines(TextInput(input_file), encoding_errors, skip_empty, tokenize)


def _iter_lines(source: TextInput, encoding_errors: str, skip_empty: bool, tokenize: bool = False) -> Iterator[Line]:
    name, kind = source.name, source.compression
    split: Callable[[str], list[str]] = str.split
    if tokenize:
        from ..tokenizer import tokenize_line as split
    count = 0
    index = -1
    try:
        lines = iter(source.stream)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                break
            except DECOMPRESSION_ERRORS as e:
                if not kind:
                    raise
                raise InputError(f"{name}: the {kind} data is corrupt or truncated after line {index + 1} "
                                 f"({' '.join(str(e).split()) or type(e).__name__})") from None
            index += 1
            if index == 0 and raw.startswith(BOM):
                raw = raw[1:]  # only there: a BOM elsewhere is a character of the text, as utf-8-sig reads it
            if "\x00" in raw:
                where = f" (after {kind} decompression)" if kind else ""
                raise InputError(f"{name}: line {index + 1}{where} holds a NUL byte: this is binary data, not text; "
                                 f"give a UTF-8 text file of sentences, one per line")
            text = _decode_line(raw, name, index + 1, encoding_errors, kind).strip()
            if not text:
                if skip_empty:
                    continue
                raise InputError(f"{name}: line {index + 1} is empty; every line must hold one "
                                 f"{'' if tokenize else 'whitespace-tokenized '}sentence (", Param("skip_empty", True),
                                 " skips such lines)")
            count += 1
            yield Line(index, text, split(text))
        if count == 0:
            raise InputError(f"{name}: the input holds no sentences")
    finally:
        source.close()


# str.split()'s whitespace among ASCII bytes (with \x1c-\x1f, which bytes.split() does not split on)
_ASCII_SPACE = np.zeros(256, dtype=bool)
_ASCII_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True


def _tokens_in(block: bytes) -> int:
    """Tokens in whole lines of the input, as read_sentences splits them."""
    if not block.isascii():  # other whitespace (U+00A0, U+3000, ...): str.split's own rules
        return len(block.decode("utf-8", "surrogateescape").split())
    space = _ASCII_SPACE[np.frombuffer(block, dtype=np.uint8)]
    if not space.size:
        return 0
    return int(np.count_nonzero(space[:-1] & ~space[1:])) + int(not space[0])  # where a token starts


class _TokenCount:
    """Counts an input file's tokens in a background thread, for the progress bar's total: the run
    starts at once, and the bar learns its total when the count is done (a plain file reads at
    200 MB/s or more, so well before the end). Only regular files: a pipe cannot be read twice."""

    def __init__(self, path: str, tokenize: bool = False) -> None:
        import threading

        self.path = path
        self.tokenize = tokenize
        self.total: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elmo-fast token count", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            source = TextInput(self.path)
        except ElmoFastError:
            return
        if self.tokenize:
            self._run_tokenizer(source)
            return
        stream = source.binary
        try:
            total, rest, first = 0, b"", True
            while not self._stop.is_set():
                chunk = stream.read(1 << 20)
                if first and chunk.startswith(b"\xef\xbb\xbf"):
                    chunk = chunk[3:]  # read_sentences drops it: it is no token (and not whitespace)
                first = False
                if not chunk:
                    self.total = total + _tokens_in(rest)
                    return
                cut = chunk.rfind(b"\n") + 1  # whole lines, so that no character or token is cut in two
                if cut:
                    total += _tokens_in(rest + chunk[:cut])
                    rest = chunk[cut:]
                else:
                    rest += chunk
        except Exception:  # noqa: BLE001  (an unreadable input is the reader's to report, not the bar's)
            return
        finally:
            source.close()

    def _run_tokenizer(self, source: TextInput) -> None:
        # tokenize=True: the tokenizer's count (about a million tokens/s in pure Python, still well
        # ahead of the embedding)
        from ..tokenizer import tokenize_line

        try:
            total, first = 0, True
            for raw in source.stream:
                if self._stop.is_set():
                    return
                total += len(tokenize_line(raw[1:] if first and raw.startswith(BOM) else raw))
                first = False
            self.total = total
        except Exception:  # noqa: BLE001  (as in _run)
            return
        finally:
            source.close()

    def wait(self, timeout: float | None = None) -> int | None:
        self._thread.join(timeout)
        return self.total

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _refuse_duplicates(lines: Iterable[Line], output: str) -> Iterator[Line]:
    """With sentence keys a repeated sentence would need one key twice: an error naming both lines.
    Holds a 16-byte digest per sentence seen, not the sentences."""
    seen: dict[bytes, int] = {}
    for line in lines:
        digest = hashlib.blake2b(line.text.encode("utf-8"), digest_size=16).digest()
        first = seen.setdefault(digest, line.index)
        if first != line.index:
            raise InputError(f"line {line.index + 1} repeats the sentence of line {first + 1}; its key would exist "
                             f"twice in {output}: do not pass ", Param("use_sentence_keys"),
                             " to encode duplicate sentences")
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
        raise InputError(f"the sentence {key!r} cannot be a dataset name in HDF5 ({e}): with ",
                         Param("use_sentence_keys"), " '/' nests groups, so '.', a trailing '/', or a sentence that is "
                         "another's group path cannot be stored; do not pass ", Param("use_sentence_keys"),
                         " for this input") from None
    if data.size:
        dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, data)


def copy_float32(source, name: str, group, key: str) -> None:
    """``group[key] = source[name]``, a dataset written by :func:`write_float32`, copied by HDF5 itself
    (H5Ocopy: no decoding into numpy and back, 4x faster than reading and writing it), with the
    names :func:`write_float32` gives."""
    import h5py

    target = key.encode("utf-8")
    try:
        if b"/" in target.lstrip(b"/"):
            parent, target = target.rsplit(b"/", 1)
            group = group.require_group(parent)
        h5py.h5o.copy(source.id, name.encode("utf-8"), group.id, target)
    except (ValueError, TypeError, KeyError, RuntimeError) as e:  # H5Ocopy reports bad names as RuntimeError
        raise InputError(f"the sentence {key!r} cannot be a dataset name in HDF5 ({e}): with ",
                         Param("use_sentence_keys"), " '/' nests groups, so '.', a trailing '/', or a sentence that is "
                         "another's group path cannot be stored; do not pass ", Param("use_sentence_keys"),
                         " for this input") from None


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
                             f"smaller ", Param("batch_size"))
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


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def plain_temp_paths(output: str) -> tuple[str, str]:
    """The temporary names of a plain run's file and of its sentence list, beside the output:
    ``.OUTPUT.HOST-PID.TOKEN.partial`` and ``.sentences``. The host and process in the name let a
    later run tell the files of a killed run from those of a live one (:func:`stale_temp_files`)."""
    out_dir = os.path.dirname(os.path.abspath(output))
    stem = os.path.join(out_dir, f".{os.path.basename(output)}.{_host_tag()}-{os.getpid()}.{secrets.token_hex(4)}")
    return stem + ".partial", stem + ".sentences"


def _temp_name_pattern(output: str) -> re.Pattern:
    # exactly our names for this output: this version's, and the untagged ones of elmo-fast 0.1 (mkstemp's)
    base = re.escape(os.path.basename(output))
    return re.compile(rf"\.{base}\.(?:(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[0-9]+)\.[0-9a-f]{{8}}|[a-z0-9_]{{8}})"
                      rf"\.(?:partial|sentences)")


def _process_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows: never call a file stale there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def stale_temp_files(output: str, remove: bool = True) -> tuple[list[str], list[str]]:
    """The temporary files that killed plain runs left beside ``output``: (removed, left with why).

    Only names of our exact pattern for this output are considered. A file is stale, and removed,
    when its name says it was made on this host by a process that is no longer running; the file of
    a live process, of another host (a shared disk), or of elmo-fast 0.1 (no owner in its name) is
    left and named, for a person to judge.
    """
    out_dir = os.path.dirname(os.path.abspath(output))
    pattern = _temp_name_pattern(output)
    removed: list[str] = []
    left: list[str] = []
    host = _host_tag()
    try:
        names = sorted(n for n in os.listdir(out_dir) if pattern.fullmatch(n))
    except OSError:
        return removed, left
    for n in names:
        m = pattern.fullmatch(n)
        path = os.path.join(out_dir, n)
        if m["pid"] is None:
            left.append(f"{path} (left by elmo-fast 0.1, which does not name its process: remove it if no run is "
                        f"writing {output})")
        elif m["host"] != host:
            left.append(f"{path} (made on host {m['host']}: remove it if no run there is writing {output})")
        elif int(m["pid"]) == os.getpid() or _process_alive(int(m["pid"])):
            left.append(f"{path} (process {m['pid']} is running: another run writing {output}?)")
        elif remove:
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                left.append(f"{path} (its process {m['pid']} is gone, but it cannot be removed: {e.strerror})")
        else:
            left.append(f"{path} (its process {m['pid']} is gone)")
    return removed, left


class _PlainWriter:
    """One HDF5 file under a temporary name beside the output, renamed into place when complete."""

    def __init__(self, output: str, keep_sentences: bool, paths: tuple[str, str]) -> None:
        import h5py

        self.output = output
        # named before they exist: whatever moment this is interrupted at, abort() knows what to remove
        self.tmp, spill_path = paths
        self.spill_path: str | None = spill_path if keep_sentences else None
        self.spill: IO[str] | None = None
        self.h5 = None
        try:
            self.h5 = h5py.File(self.tmp, "x")
            if keep_sentences:
                # sentence_to_index needs every sentence: kept on disk until the end, not in memory
                self.spill = open(spill_path, "x", encoding="utf-8")
        except BaseException:
            self.abort()
            raise

    def begin(self, start: int) -> None:
        pass  # one file: where a window starts does not matter

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
        # from here the output is complete: abort() removes only the temporary names, never the output
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
        remove_quietly(self.tmp, self.spill_path)


def remove_quietly(*paths: str | None) -> None:
    for path in paths:
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
    # (a key that only some runs record, as "tokenize", counts from either side)
    keys = sorted(set(now) | ({"tokenize"} & set(then)))

    def get(record: dict, k: str) -> Any:
        return record.get(k, False) if k == "tokenize" else record.get(k)

    return [f"{k}: {get(then, k)!r} then, {get(now, k)!r} now" for k in keys
            if k not in ("input", "complete") and get(then, k) != get(now, k)]


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
            or name.startswith("progress-") and (name.endswith(".json") or name.endswith(".json.tmp"))
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


def shard_name(start: int) -> str:
    """The shard holding the window whose first sentence is the input's start-th (0-based, counting
    the sentences read, so skipped empty lines do not count)."""
    return f"shard-{start:06d}.h5"


def _shard_attrs(path: str) -> dict:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return {"name": os.path.basename(path), "start": int(f.attrs["start"]), "n": int(f.attrs["n"]),
                    "tokens": int(f.attrs["tokens"]), "digest": str(f.attrs["digest"]),
                    "first_line": int(f.attrs["first_line"]), "last_line": int(f.attrs["last_line"])}
    except (OSError, KeyError) as e:  # renamed only once complete and fsync'ed: a damaged disk
        raise ElmoFastError(f"{path} is unreadable ({e}); remove its directory to start over") from None


def list_shards(work: str) -> list[dict]:
    """The complete shards of a work directory, by start, each named after its start and none
    overlapping the next (the windows of any number of ranks, or of runs with other windows)."""
    shards = sorted((_shard_attrs(os.path.join(work, n)) for n in _shard_names(work)), key=lambda s: s["start"])
    for i, s in enumerate(shards):
        if s["name"] != shard_name(s["start"]):
            raise ElmoFastError(f"{work}: shard {s['name']} holds the sentences from {s['start']} on (expected the "
                                f"name {shard_name(s['start'])}); remove {work} to start over")
        if i and shards[i - 1]["start"] + shards[i - 1]["n"] > s["start"]:
            raise ElmoFastError(f"{work}: shards {shards[i - 1]['name']} and {s['name']} overlap; remove {work} "
                                f"to start over")
    return shards


class _ShardWriter:
    """Work directory OUTPUT.partial/: a manifest, then one complete shard file per window.

    role: "solo" (one process), "leader" (rank 0 of a group: prepares the directory, assembles the
    output) or "member" (another rank: writes its windows' shards only, never removes anything but
    its own half-written shard)."""

    def __init__(self, output: str, manifest: dict, role: str = "solo") -> None:
        self.output = output
        self.work = work_dir_of(output)
        self.manifest = manifest
        self.role = role
        self.done: list[dict] = []  # the complete shards found at the start, by start
        self.written = 0  # shards this process completed
        self.h5 = None
        self.tmp: str | None = None
        self.start: int | None = None
        existing = _read_manifest(self.work) if os.path.isdir(self.work) else None
        if existing is None:
            if role == "member":
                raise ElmoFastError(f"{self.work}: no manifest, though rank 0 wrote one: the output's directory must "
                                    f"be on a filesystem that every rank shares")
            if os.path.isdir(self.work):
                remove_work_dir(self.work)  # a void leftover (killed while created or torn down)
            os.mkdir(self.work)
            try:
                _write_json_atomic(os.path.join(self.work, MANIFEST), manifest)
            except BaseException:  # a signal or a full disk now: nothing is done yet, so nothing stays
                remove_work_dir(self.work)
                raise
            return
        differs = _differences(existing, manifest)
        if differs:
            raise ElmoFastError(f"cannot resume {self.work}: the interrupted run differs ({'; '.join(differs)}); rerun "
                                f"with its settings, or remove {self.work} to start over")
        self.manifest = existing
        if self.complete or role == "member":  # complete: the assembled file is final; shards may be half deleted
            return
        for n in os.listdir(self.work):
            if n.endswith(".tmp") or n == "assembling.h5":
                os.unlink(os.path.join(self.work, n))  # cut short by the kill: redone below
        self.done = list_shards(self.work)

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def begin(self, start: int) -> None:
        """The next window starts at the input's start-th sentence."""
        self.start = start

    def _open(self) -> None:
        import h5py

        self.tmp = os.path.join(self.work, shard_name(self.start) + ".tmp")
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
        f.attrs.update({"start": self.start, "n": len(window), "tokens": sum(len(line.tokens) for line in window),
                        "digest": _lines_digest(window), "first_line": window[0].index,
                        "last_line": window[-1].index})
        f.close()
        self.h5 = None
        _fsync_path(self.tmp)
        os.replace(self.tmp, self.tmp[: -len(".tmp")])  # its presence now says: these sentences are done
        _fsync_path(self.work, directory=True)
        self.tmp = None
        self.written += 1

    def saved_states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The LSTM states after the last complete shard (stateful runs: their shards are a prefix)."""
        import h5py

        if not self.done:
            return None
        with h5py.File(os.path.join(self.work, self.done[-1]["name"]), "r") as f:
            if "state_h" not in f:
                return None
            return torch.from_numpy(f["state_h"][...]), torch.from_numpy(f["state_c"][...])

    def _covering(self, total: int, patience: float) -> list[dict]:
        """The shards that hold sentences 0..total-1, in order. A group's shards were written on other
        machines: on a network filesystem a file renamed there may show here a moment later."""
        deadline = time.monotonic() + patience
        while True:
            shards = list_shards(self.work)
            end = 0
            for s in shards:
                if s["start"] != end:  # sentences end..start-1 missing
                    break
                end += s["n"]
            else:
                if end == total:
                    return shards
                if end > total:
                    raise ElmoFastError(f"{self.work} holds shards of {end} sentences, but the input has {total}; "
                                        f"remove {self.work} to start over")
            if time.monotonic() >= deadline:
                missing = next((s["start"] for s in shards if s["start"] > end), total)
                raise ElmoFastError(f"{self.work} holds no shard for sentences {end + 1}..{missing} of the input "
                                    f"(counted from 1): a rank's work is missing; is the directory on a filesystem "
                                    f"that every rank shares?")
            time.sleep(0.5)

    def finish(self, total: int | None = None, patience: float = 0.0, on_copied=None) -> None:
        """Assemble OUTPUT from the shards covering the input's total sentences (the leader, or a
        solo run), each dataset copied once by HDF5 itself (H5Ocopy), then rename it into place.
        on_copied(count): called after each sentence copied (the test hook's moment)."""
        import h5py

        assembling = os.path.join(self.work, "assembling.h5")
        if not self.complete:
            shards = self._covering(total, patience)
            use_keys = self.manifest["use_sentence_keys"]
            keep = not use_keys and not self.manifest["forget_sentences"]
            pairs: list[tuple[str, str]] = []
            copied = 0
            with h5py.File(assembling, "w") as fout:
                for shard in shards:
                    with h5py.File(os.path.join(self.work, shard["name"]), "r") as f:
                        texts = f["text"].asstr()[...]
                        lines = f["lines"][...]
                        vectors = f["v"]
                        for j, (index, text) in enumerate(zip(lines, texts)):
                            key = text if use_keys else str(int(index))
                            copy_float32(vectors, str(j), fout, key)
                            if keep:
                                pairs.append((text, key))
                            copied += 1
                            if on_copied is not None:
                                on_copied(copied)
                if keep:
                    _write_sentence_map(fout, pairs)
                record = {k: v for k, v in self.manifest.items() if k != "complete"}
                fout.attrs[RUN_RECORD] = json.dumps({**record, "shards": [[s["n"], s["digest"]] for s in shards]})
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
        if self.role == "solo" and not self.done and not self.written and os.path.isdir(self.work):
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
                raise ElmoFastError(f"{work} holds an interrupted run ({n} window(s) done); pass ",
                                    Param("resume", True), " to continue it, or remove that directory to start over")
            return  # the run that made it passed the checks below; it may replace the output
    if os.path.exists(output) and not overwrite:
        if resume and _run_record(output) is not None:
            return  # made by a resume run that finished; embed_corpus checks that it was this one
        raise ElmoFastError(f"{output} already exists; pass ", Param("overwrite", True), " to replace it")


def _model_identity(embedder: ElmoEmbedder) -> dict:
    bilm = embedder.elmo_bilm
    return {**{role: _file_digest(os.fspath(path)) for role, path in embedder.model_files.items()},
            "backend": bilm.backend, "dtype": str(bilm.compute_dtype), "device": embedder.device.type}


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
        raise ElmoFastError(f"{output} already exists, made by another run ({why}); pass ", Param("overwrite", True),
                            " to replace it")
    if not rereadable:
        raise ElmoFastError(f"{output} was made by another run ({why}), and {name} cannot be read twice; "
                            f"remove {output} to embed it")
    return False


class _LogLines(io.TextIOBase):
    """Progress for log files: each refresh of the bar on a line of its own, never a carriage return."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _progress_bar(total: int | None, initial: int, progress: bool | str):
    """A bar of tokens (sentences vary in length too much, once sorted by it, for an ETA in lines).
    progress="log": a line at most every 10 s instead of a redrawn bar (allennlp's
    --file-friendly-logging)."""
    from tqdm import tqdm

    if progress == "log":
        return tqdm(total=total, initial=initial, unit="tok", file=_LogLines(sys.stderr),
                    mininterval=10.0, ascii=True, ncols=100)
    return tqdm(total=total, initial=initial, unit="tok", disable=not progress, file=sys.stderr,
                dynamic_ncols=True)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def summary_lines(stats: dict, output: str) -> list[str]:
    """The closing lines of a run: what was embedded, where, how long it all took and the steady rate
    (after the first batch, which pays for warm-up), and the settings that explain that rate. A
    group's (torchrun's) counts and rates are the sums over its ranks."""
    resumed = f" (after {stats['resumed_sentences']:,} done before)" if stats["resumed_sentences"] else ""
    assembling = (f", {stats['assembly_seconds']:.2f} s of it assembling the output"
                  if stats.get("assembly_seconds") else "")
    first = (f"elmo-fast: {stats['sentences']:,} sentences, {stats['tokens']:,} tokens{resumed} -> {output} "
             f"({_size(stats['output_bytes'])}) in {stats['wall_seconds']:.2f} s ({stats['startup_seconds']:.2f} s "
             f"to start, {stats['seconds']:.2f} s to embed and write{assembling})")
    ranks = stats.get("ranks", 1)
    if stats["steady_tokens_per_s"] is not None:
        summed = f"; the sum over {ranks} ranks" if ranks > 1 else ""
        rate = (f"{stats['steady_tokens_per_s']:,.0f} tokens/s steady (after the first batch, "
                f"{stats['warmup_seconds']:.2f} s with warm-up{summed})")
    else:
        rate = f"{stats['tokens_per_s']:,.0f} tokens/s in one batch, warm-up included (too few for a steady rate)"
    second = (f"elmo-fast: {rate}; backend {stats['backend']}, {'stateful' if stats['stateful'] else 'stateless'}, "
              f"{stats['dtype']}, {stats['device']}{f' x {ranks} ranks' if ranks > 1 else ''}")
    return [first, second]


@dataclass
class _Window:
    """A window of the input: its sentences, from the input's start-th on (0-based, counting the
    sentences read), and either the complete shard of an earlier run that holds them, or whether
    this rank embeds them."""
    start: int
    lines: list[Line]
    shard: dict | None
    mine: bool


def _windows(lines: Iterator[Line], window: int, done: Sequence[dict], owns: Callable[[int], bool],
             name: str, work: str) -> Iterator[_Window]:
    """Cut the input into windows of at most ``window`` sentences around the complete shards of
    earlier runs (``done``, by start; each is checked against the input's lines). The k-th window
    still to embed (k from 0) is this rank's when ``owns(k)``."""
    position = 0
    k = 0
    shards = iter(done)
    upcoming = next(shards, None)
    while True:
        if upcoming is not None and upcoming["start"] == position:
            got = list(islice(lines, upcoming["n"]))
            if len(got) < upcoming["n"] or _lines_digest(got) != upcoming["digest"]:
                raise InputError(f"{name}: lines {upcoming['first_line'] + 1}..{upcoming['last_line'] + 1} are not "
                                 f"those the interrupted run embedded into {upcoming['name']} (the input changed "
                                 f"since); remove {work} to start over")
            yield _Window(position, got, upcoming, False)
            position += len(got)
            upcoming = next(shards, None)
            continue
        size = window if upcoming is None else min(window, upcoming["start"] - position)
        chunk = list(islice(lines, size))
        if not chunk:
            if upcoming is not None:
                raise InputError(f"{name}: lines {upcoming['first_line'] + 1}..{upcoming['last_line'] + 1} are not "
                                 f"those the interrupted run embedded into {upcoming['name']} (the input is shorter "
                                 f"now); remove {work} to start over")
            return
        yield _Window(position, chunk, None, owns(k))
        position += len(chunk)
        k += 1


def _join_group(ranks, output: str, manifest: dict, lines: Iterator[Line], name: str, overwrite: bool,
                progress: bool | str) -> tuple[_ShardWriter | None, list[dict]]:
    """The start of a group's run: rank 0 checks the output, prepares the work directory and sends
    the others what is done already; every other rank checks that it sees that directory and the
    same input. Returns this rank's writer and the complete shards, or (None, []) when the output
    is complete already."""
    if ranks.rank == 0:
        writer = None
        try:
            if _finished_already(output, manifest, lines, name, overwrite, True):
                if progress:
                    print(f"elmo-fast: {output} is complete already: nothing to resume", file=sys.stderr)
            else:
                writer = _ShardWriter(output, manifest, role="leader")
                if writer.complete:  # killed between assembling the file and renaming it: finish that
                    writer.finish()
                    writer = None
            message = {"state": "finished"} if writer is None else {
                "state": "go", "token": ranks.new_attempt(), "done": writer.done,
                "input_bytes": os.path.getsize(name)}
        except Exception as e:  # the others wait for a message: tell them, rather than leave them to a timeout
            parts = e.parts if isinstance(e, ElmoFastError) else (f"{type(e).__name__}: {e}",)
            ranks.broadcast({"state": "failed", "parts": parts})
            raise
        ranks.broadcast(message)
        return writer, (writer.done if writer is not None else [])
    message = ranks.broadcast(None)
    if message["state"] == "failed":
        raise ElmoFastError("rank 0 stopped: ", *message["parts"])
    if message["state"] == "finished":
        return None, []
    ranks.check_shared(message["token"])
    size = os.path.getsize(name)
    if size != message["input_bytes"]:
        raise ElmoFastError(f"rank {ranks.rank} (host {ranks.host}) reads {name} of {size:,} bytes, rank 0 one of "
                            f"{message['input_bytes']:,} bytes: every rank must read the same input, from a "
                            f"filesystem that all of them share")
    return _ShardWriter(output, manifest, role="member"), message["done"]


def _refusal_in_a_group(why: str, *what: str | Param) -> ElmoFastError:
    return ElmoFastError(*what, f" cannot be split among the ranks of a group (torchrun): {why}")


def embed_corpus(embedder: ElmoEmbedder, input_file: str | os.PathLike | IO, output_file_path: str | os.PathLike,
                 output_format: str = "all", batch_size: int | None = None, forget_sentences: bool = False,
                 use_sentence_keys: bool = False, progress: bool | str = True, *,
                 max_tokens_per_batch: int | None = None, bucketing: bool | None = None, window: int = DEFAULT_WINDOW,
                 resume: bool = False, overwrite: bool = True, skip_empty: bool = False,
                 encoding_errors: str = "strict", started: float | None = None,
                 distributed: bool = False, tokenize: bool = False) -> dict[str, Any]:
    """The body of :meth:`ElmoEmbedder.embed_file` (see there)."""
    from . import ranks as group

    called = time.perf_counter()
    started = called if started is None else started
    output = os.fspath(output_file_path)
    bilm = embedder.elmo_bilm
    stateful = bilm.stateful
    batch_size = embedder.batch_size if batch_size is None else batch_size
    if output_format not in OUTPUT_FORMATS:
        raise ElmoFastError(Param("output_format"), f" must be one of {', '.join(OUTPUT_FORMATS)}, "
                            f"got {output_format!r}")
    if encoding_errors not in ENCODING_ERRORS:
        raise ElmoFastError(Param("encoding_errors"), f" must be one of {', '.join(ENCODING_ERRORS)}, "
                            f"got {encoding_errors!r}")
    for what, value in (("batch_size", batch_size), ("max_tokens_per_batch", max_tokens_per_batch), ("window", window)):
        if value is not None and value < 1:
            raise ElmoFastError(Param(what), f" must be >= 1, got {value}")
    name = (os.fspath(input_file) if isinstance(input_file, (str, os.PathLike))
            else str(getattr(input_file, "name", "<input>")))
    rereadable = isinstance(input_file, (str, os.PathLike))
    ranks: group.Ranks | None = None
    if distributed:
        if stateful:
            raise _refusal_in_a_group("the LSTM states flow from each batch to the next in input order, so one "
                                      "process must embed it all; run it without torchrun", "a stateful run (",
                                      Param("stateful", True), ")")
        if not rereadable:
            raise _refusal_in_a_group("every rank reads the input itself; give a file on a filesystem that every "
                                      "rank shares", f"input from a stream ({name})")
        ranks = group.Ranks.join(work_dir_of(output))
        resume = True  # the work directory is how ranks write, and how a restarted group continues
        if ranks.rank != 0:
            progress = False
    rank = 0 if ranks is None else ranks.rank
    if stateful:
        if max_tokens_per_batch is not None or bucketing:
            raise ElmoFastError("stateful mode keeps input order (the LSTM states flow from each batch to the next), so "
                                "it cannot sort sentences into batches by length: drop ",
                                Param("max_tokens_per_batch") if max_tokens_per_batch is not None
                                else Param("bucketing", True), " and bound batches with ", Param("batch_size"))
        bucketing, max_tokens = False, None
        window = -(-window // batch_size) * batch_size  # whole batches, so a resumed run cuts the same ones
    else:
        bucketing = True if bucketing is None else bucketing
        max_tokens = max_tokens_per_batch if max_tokens_per_batch is not None else (
            DEFAULT_MAX_TOKENS if bucketing else None)
    check_output(output, overwrite, resume)
    if embedder.device.type == "cuda" and bilm.backend == "fast":
        from ..bilm.ops import require_cuda_kernels

        require_cuda_kernels()  # now, not at the first batch after the output was begun
    if rank == 0:
        removed, left = stale_temp_files(output)
        if progress:
            for path in removed:
                print(f"elmo-fast: removed {path}, left by a run that was killed", file=sys.stderr)
            for what in left:
                print(f"elmo-fast: note: {what}", file=sys.stderr)

    def sentences() -> Iterator[Line]:
        lines: Iterator[Line] = read_sentences(input_file, encoding_errors, skip_empty, tokenize)
        return _refuse_duplicates(lines, output) if use_sentence_keys else lines

    lines = sentences()
    keep_sentences = not forget_sentences and not use_sentence_keys
    info = {"backend": bilm.backend, "stateful": stateful, "dtype": str(bilm.compute_dtype).replace("torch.", ""),
            "device": str(embedder.device)}
    nothing = {"sentences": 0, "tokens": 0, "seconds": 0.0, "tokens_per_s": 0.0, "resumed_sentences": 0,
               "oom_splits": 0, **info}

    writer: _PlainWriter | _ShardWriter | None = None
    paths = None
    counter = None
    done: list[dict] = []
    n_sentences = n_tokens = n_batches = 0
    others: list[dict] = []
    try:
        if resume:
            manifest = {"version": _MANIFEST_VERSION, "input": name, "output_format": output_format,
                        "use_sentence_keys": use_sentence_keys, "forget_sentences": forget_sentences,
                        "stateful": stateful, "batch_size": batch_size if stateful else None,
                        **({"tokenize": True} if tokenize else {}),  # (absent otherwise: older work areas resume)
                        **_model_identity(embedder)}
            if ranks is not None:
                writer, done = _join_group(ranks, output, manifest, lines, name, overwrite, progress)
                if writer is None:
                    return nothing
            else:
                if _finished_already(output, manifest, lines, name, overwrite, rereadable):
                    if progress:
                        print(f"elmo-fast: {output} is complete already: nothing to resume", file=sys.stderr)
                    return nothing
                writer = _ShardWriter(output, manifest)
                if writer.complete:  # killed between assembling the file and renaming it: finish that
                    writer.finish()
                    return nothing
                done = writer.done
            if rereadable:
                lines = sentences()  # from the start again, if it was read
            if stateful and any(s["start"] != sum(d["n"] for d in done[:i]) for i, s in enumerate(done)):
                raise ElmoFastError(f"{writer.work}: its shards leave gaps, so the LSTM states to continue from are "
                                    f"unknown (a stateful run leaves none); remove {writer.work} to start over")
        else:
            paths = plain_temp_paths(output)
            writer = _PlainWriter(output, keep_sentences, paths)
        runner = _BatchRunner(embedder, output_format, max_tokens)
        if stateful and isinstance(writer, _ShardWriter) and (states := writer.saved_states()) is not None:
            bilm.set_states(states)
        counter = _TokenCount(name, tokenize) if rereadable and progress and os.path.isfile(name) else None
        start = time.perf_counter()
        first_done = last_done = None
        first_tokens = 0
        total_sentences = 0  # in the input, once read to its end
        heard = {"tokens": 0, "at": float("-inf")}  # rank 0: the others' tokens, as last read

        def own_counts(final: bool = False) -> dict:
            steady = None
            if first_done is not None and last_done > first_done:
                steady = (n_tokens - first_tokens) / (last_done - first_done)
            return {"tokens": n_tokens, "sentences": n_sentences, "steady": steady, "oom_splits": runner.oom_splits,
                    "final": final}

        def hear_others(bar, force: bool = False) -> None:
            # rank 0 adds the other ranks' tokens to its bar, whose rate is then the group's
            if ranks is None or ranks.rank != 0 or ranks.world == 1:
                return
            now = time.monotonic()
            if not force and now - heard["at"] < group.PROGRESS_EVERY:
                return
            heard["at"] = now
            tokens = sum(r["tokens"] for r in ranks.others())
            if tokens > heard["tokens"]:
                bar.update(tokens - heard["tokens"])
                heard["tokens"] = tokens

        def learn_total(bar) -> None:
            if bar.total is None and counter is not None and counter.total is not None:
                bar.total = counter.total

        owns = ranks.owns if ranks is not None else (lambda k: True)
        with _progress_bar(None, sum(s["tokens"] for s in done), progress) as bar:
            for win in _windows(lines, window, done, owns, name, work_dir_of(output)):
                total_sentences = win.start + len(win.lines)
                if not win.mine:  # done before, or another rank's
                    hear_others(bar)
                    continue
                chunk = win.lines
                writer.begin(win.start)
                order = sorted(chunk, key=lambda line: (len(line.tokens), line.index)) if bucketing else chunk
                position = {id(line): j for j, line in enumerate(chunk)}
                keys = [line.text if use_sentence_keys else str(line.index) for line in chunk]
                for batch in _iter_batches(order, batch_size, lambda: runner.max_tokens):
                    batch_tokens = 0
                    for line, data in zip(batch, runner.outputs(batch)):
                        j = position[id(line)]
                        writer.put(j, keys[j], data)
                        batch_tokens += len(line.tokens)
                    n_tokens += batch_tokens
                    n_batches += 1
                    last_done = time.perf_counter()
                    if first_done is None:
                        first_done, first_tokens = last_done, n_tokens
                    learn_total(bar)
                    bar.update(batch_tokens)
                    hear_others(bar)
                    if ranks is not None:
                        ranks.publish(own_counts())  # at most every PROGRESS_EVERY seconds
                    group.kill_point(rank, "batch", n_batches)
                writer.window_done(chunk, keys, bilm.get_states() if stateful else None)
                n_sentences += len(chunk)
                if ranks is not None:
                    group.kill_point(rank, "window", writer.written)
            if ranks is not None:
                ranks.publish(own_counts(final=True), force=True)
                ranks.arrive()
                while not ranks.everyone_arrived():  # rank 0's bar moves with the others' work meanwhile
                    hear_others(bar)
                    learn_total(bar)
                    time.sleep(0.1)
                ranks.wait()
                hear_others(bar, force=True)
                others = ranks.others()  # their final counts (the work directory goes with the assembly)
            if counter is not None and bar.total is None:
                bar.total = counter.wait()  # read ahead of the model: done, or about to be
                bar.refresh()
        embedded = time.perf_counter()
        if isinstance(writer, _PlainWriter):
            writer.finish()
        elif rank == 0:
            writer.finish(total_sentences, patience=60.0 if ranks is not None and ranks.world > 1 else 0.0,
                          on_copied=lambda count: group.kill_point(rank, "assemble", count))
    except BaseException:
        if counter is not None:
            counter.stop()
        if writer is not None:
            writer.abort()
        elif paths is not None:  # interrupted while the writer was being made
            remove_quietly(*paths)
        raise
    end = time.perf_counter()
    own = own_counts(final=True)
    stats = {"sentences": n_sentences, "tokens": n_tokens, "seconds": end - start,
             "resumed_sentences": sum(s["n"] for s in done), "oom_splits": runner.oom_splits,
             "wall_seconds": end - started, "startup_seconds": start - started,
             "warmup_seconds": (first_done - start) if first_done is not None else 0.0,
             "steady_tokens_per_s": own["steady"], "assembly_seconds": end - embedded if resume else 0.0,
             "output_bytes": os.path.getsize(output) if rank == 0 else 0,
             "ranks": ranks.world if ranks is not None else 1, "rank": rank, **info}
    if ranks is not None and rank == 0 and ranks.world > 1:  # the group's totals
        everyone = [own, *others]
        for key in ("sentences", "tokens", "oom_splits"):
            stats[key] = sum(r[key] for r in everyone)
        rates = [r["steady"] for r in everyone if r["steady"] is not None]
        stats["steady_tokens_per_s"] = sum(rates) if rates else None
    stats["tokens_per_s"] = stats["tokens"] / stats["seconds"] if stats["seconds"] > 0 else float("inf")
    if progress:
        for line in summary_lines(stats, output):
            print(line, file=sys.stderr)
    return stats
