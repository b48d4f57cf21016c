"""Keys seen before, in bounded memory: how a FASTA input's record ids (and, with sentence keys, a text
input's sentences) are checked to be unique, whatever the input's size.

Each key is held as a 16-byte BLAKE2b digest (two different keys share one with a probability near
2^-128: never in practice) with the line it was first seen on. The newest :data:`MEMORY_ENTRIES`
digests are in a dict; when it is full they go to disk as a sorted run (a scratch file of fixed-size
entries), and runs are merged four at a time into runs four times larger (a log-structured merge), so
that a key is looked for in a few runs, and each entry is rewritten a few times in all, however many
records the input holds. In memory, besides the dict: a 16 MiB bitmap of the digests on disk (most new
keys are not on it and skip the disk), every 256th digest of each run (0.03 bytes a record), and a
merge's buffers. A UniRef50-sized FASTA (tens of millions of records) thus needs about the memory of a
small one; an input under :data:`MEMORY_ENTRIES` keys never touches the disk.

The runs have :mod:`elmo_fast.durable`'s temporary names beside the output
(``.OUTPUT.HOST-PID.TOKEN.ids.elmo-tmp``): they are removed when the input has been read, or by the
next run if this one was killed (:mod:`.leftovers`); they are never outputs. Measured in BENCHMARKS.md
(memory on the largest inputs, ``benchmarks/bench_fasta_memory.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import numpy as np

from .. import durable

#: digests held in memory before they go to disk (~15 MB of Python objects at most)
MEMORY_ENTRIES = 1 << 17
#: runs of one size merged into one run
MERGE_FAN_IN = 4
#: entries between two digests of a run kept in memory (a lookup reads two such blocks)
_BLOCK = 256
#: entries a merge reads from each run at a time
_CHUNK = 1 << 16
#: the bitmap of the digests on disk: 2^27 bits (16 MiB), indexed by a digest's first 27 bits
_FILTER_SHIFT = 64 - 27
#: a run's entry: the digest as two integers (sorted by hi, then lo), and its line
_ENTRY = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("line", "<i8")])


def digest(key: str) -> bytes:
    """The 16-byte digest a key is held as."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class _Run:
    """One sorted run on disk: ``n`` entries, every :data:`_BLOCK`-th ``hi`` in ``fences``; ``writer`` the
    scratch file's (its ``abort`` removes it)."""

    def __init__(self, writer: durable.FileWriter, n: int, fences: np.ndarray) -> None:
        self.writer, self.path, self.n, self.fences = writer, writer.temp, n, fences
        self.fd = os.open(self.path, os.O_RDONLY)

    def read(self, start: int, count: int) -> np.ndarray:
        count = max(0, min(count, self.n - start))
        data = os.pread(self.fd, count * _ENTRY.itemsize, start * _ENTRY.itemsize)
        if len(data) != count * _ENTRY.itemsize:
            raise durable.WriteError(self.path, "the scratch file of keys seen was cut short while in use")
        return np.frombuffer(data, dtype=_ENTRY)

    def line_of(self, hi: int, lo: int) -> int | None:
        block = max(int(np.searchsorted(self.fences, hi, "left")) - 1, 0)
        entries = self.read(block * _BLOCK, 2 * _BLOCK)  # (an equal hi may straddle a fence)
        i = int(np.searchsorted(entries["hi"], hi, "left"))
        while i < len(entries) and int(entries["hi"][i]) == hi:
            if int(entries["lo"][i]) == lo:
                return int(entries["line"][i])
            i += 1
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.writer.abort()


class _RunWriter:
    """A run written in key order, chunk by chunk, its fences taken as it goes: a scratch file of
    :mod:`elmo_fast.durable` beside ``beside`` (a failed write is a WriteError naming it)."""

    def __init__(self, beside: str) -> None:
        self.writer = durable.FileWriter(beside, "wb", encoding=None, tag="ids")
        self.n = 0
        self.fences: list[np.ndarray] = []

    def write(self, entries: np.ndarray) -> None:
        self.fences.append(entries["hi"][(-self.n) % _BLOCK :: _BLOCK].copy())
        self.writer.write(entries.tobytes())
        self.n += len(entries)

    def finish(self) -> _Run:
        self.writer.close()
        fences = np.concatenate(self.fences) if self.fences else np.zeros(0, dtype=np.uint64)
        return _Run(self.writer, self.n, fences)

    def abort(self) -> None:
        self.writer.abort()


class SeenKeys:
    """``first_line(key, line)``: the line ``key`` was seen on before (its first), or None, and from now
    on ``key`` is seen at ``line``. ``beside``: the file beside which the runs go when the keys outgrow
    memory (the output; None: a private folder in the system's temporary area). ``close()`` removes them."""

    def __init__(self, beside: str | os.PathLike | None, memory_entries: int | None = None) -> None:
        self.beside = os.fspath(beside) if beside is not None else None
        self.memory_entries = memory_entries if memory_entries is not None else MEMORY_ENTRIES
        self.memory: dict[bytes, int] = {}
        self.runs: list[tuple[int, _Run]] = []  # (level, run), oldest first
        self.filter: bytearray | None = None
        self.scratch = contextlib.ExitStack()  # (the private folder, when there is no output to go beside)
        self.spilled = 0  # digests on disk

    def first_line(self, key: str, line: int) -> int | None:
        d = digest(key)
        first = self.memory.get(d)
        if first is not None:
            return first
        if self.filter is not None:
            hi = int.from_bytes(d[:8], "big")
            index = hi >> _FILTER_SHIFT
            if self.filter[index >> 3] & (1 << (index & 7)):
                lo = int.from_bytes(d[8:], "big")
                for _, run in self.runs:
                    found = run.line_of(hi, lo)
                    if found is not None:
                        return found
        self.memory[d] = line
        if len(self.memory) >= self.memory_entries:
            self._spill()
        return None

    @property
    def paths(self) -> list[str]:
        """The runs' files on disk now."""
        return [run.path for _, run in self.runs]

    def _writer(self) -> _RunWriter:
        if self.beside is None:
            self.beside = os.path.join(self.scratch.enter_context(durable.scratch_dir("elmo-fast-ids-")), "ids")
        return _RunWriter(self.beside)

    def _spill(self) -> None:
        n = len(self.memory)
        digests = np.frombuffer(b"".join(self.memory), dtype=">u8").reshape(n, 2)  # (hi, lo), big-endian
        entries = np.empty(n, dtype=_ENTRY)
        entries["hi"], entries["lo"] = digests[:, 0], digests[:, 1]
        entries["line"] = np.fromiter(self.memory.values(), dtype=np.int64, count=n)
        entries = entries[np.lexsort((entries["lo"], entries["hi"]))]  # in digest order
        writer = self._writer()
        try:
            writer.write(entries)
            run = writer.finish()
        except BaseException:
            writer.abort()
            raise
        if self.filter is None:
            self.filter = bytearray(1 << (64 - _FILTER_SHIFT - 3))
        index = entries["hi"] >> np.uint64(_FILTER_SHIFT)
        bits = np.frombuffer(self.filter, dtype=np.uint8)
        np.bitwise_or.at(bits, (index >> np.uint64(3)).astype(np.intp), (1 << (index & np.uint64(7))).astype(np.uint8))
        self.runs.append((0, run))
        self.spilled += len(entries)
        self.memory.clear()
        self._compact()

    def _compact(self) -> None:
        """While MERGE_FAN_IN runs share a level, merge them into one of the next level."""
        while True:
            levels = [level for level, _ in self.runs]
            full = next((lv for lv in sorted(set(levels)) if levels.count(lv) >= MERGE_FAN_IN), None)
            if full is None:
                return
            merging = [run for level, run in self.runs if level == full]
            merged = self._merge(merging)
            self.runs = [(level, run) for level, run in self.runs if level != full] + [(full + 1, merged)]
            for run in merging:
                run.close()

    def _merge(self, runs: list[_Run]) -> _Run:
        """One run of all of ``runs``' entries, in key order, read and written a chunk at a time."""
        writer = self._writer()
        try:
            at = [0] * len(runs)
            chunks = [run.read(0, _CHUNK) for run in runs]
            while any(len(c) for c in chunks):
                # what can be written now: up to the smallest last key among runs with more to read
                bounds = [int(c["hi"][-1]) for c, run, a in zip(chunks, runs, at) if len(c) and a + len(c) < run.n]
                bound = min(bounds) if bounds else None
                pieces = []
                for k, chunk in enumerate(chunks):
                    take = len(chunk) if bound is None else int(np.searchsorted(chunk["hi"], bound, "right"))
                    pieces.append(chunk[:take])
                    at[k] += take
                    rest = chunk[take:]
                    if len(rest) < _CHUNK // 2 and at[k] + len(rest) < runs[k].n:  # top it up
                        rest = np.concatenate([rest, runs[k].read(at[k] + len(rest), _CHUNK - len(rest))])
                    chunks[k] = rest
                block = np.concatenate(pieces)
                block = block[np.lexsort((block["lo"], block["hi"]))]
                if len(block):
                    writer.write(block)
            return writer.finish()
        except BaseException:
            writer.abort()
            raise

    def close(self) -> None:
        """Forget everything, and remove the runs (if any were made)."""
        for _, run in self.runs:
            run.close()
        self.runs = []
        self.memory.clear()
        self.filter = None
        self.scratch.close()
