"""The write stage: where each sentence's vectors go, and what makes the output final.

Both writers share one interface (:class:`Writer`), and write every file through
:mod:`elmo_fast.durable`, so a file under its final name is whole:

* :class:`PlainWriter` (default): the output, open under a temporary name beside it from the first
  batch to the last (a :class:`~elmo_fast.durable.Hdf5Writer`), made final (closed checked, fsync'ed,
  renamed) by ``finish``; a failure, Ctrl-C
  or (through the CLI's handlers) SIGTERM or SIGHUP discards it, and a ``kill -9``'s leftovers are
  swept by the next run (:mod:`.leftovers`).
* :class:`ShardWriter` (``resume=True``, and every rank of a group): one shard per window in the work
  directory (:mod:`.work_area`), made final as the window is recorded, then its completion record
  (:mod:`.shard_records`), so that completed windows survive any kill and a resumed run can check
  them; ``finish`` assembles the output from the shards.
"""

from __future__ import annotations

import json
import os
from typing import Protocol

import numpy as np
import torch

from .. import durable
from .assembly import assemble
from .batching import Window
from .layout import write_float32, write_sentence_map
from .lines import Line, lines_digest
from .shard_records import write_record
from .work_area import (
    ASSEMBLING,
    assembled_record,
    open_work_dir,
    remove_work_dir,
    saved_states,
    shard_name,
    work_dir_of,
    write_manifest,
)


class Writer(Protocol):
    """What the pipeline writes through, in this order: ``open`` once, ``write`` each sentence's
    vectors, ``record`` each window once its sentences are written (the unit of work a resume keeps),
    then ``finish`` (the output is final) or, on any failure or interruption, ``abort`` (nothing
    half-written is left under a final name; what is complete and worth resuming stays)."""

    def open(self) -> list[dict]:
        """Begin; returns the complete shards of an interrupted run, by start (none for a plain run)."""

    def write(self, window: Window, line: Line, vectors: np.ndarray, attrs: dict | None = None) -> None:
        """One sentence's vectors, float32, in the output's format: [L + 1, T, 2P] ("all") or [T, 2P] (or a
        FASTA record's per-protein vector); ``attrs``: the dataset's attributes (per-protein vectors)."""

    def record(self, window: Window, states: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Every sentence of ``window`` is written; ``states``: the LSTM states after it (stateful runs)."""

    def finish(self, total: int) -> None:
        """Make the output final; ``total``: the input's sentences, all written (by any rank)."""

    def abort(self) -> None:
        """Called after any failure or interruption, one in ``open`` or ``finish`` included."""


class PlainWriter:
    """The output, written under a temporary name beside it and renamed into place when complete. The
    (sentence, key) pairs of ``sentence_to_index`` wait in a scratch file beside it until the end, so
    that memory does not grow with the corpus."""

    def __init__(self, output: str, keep_sentences: bool) -> None:
        self.path = output
        self.keep_sentences = keep_sentences
        self.output: durable.Hdf5Writer | None = None
        self.sentences: durable.FileWriter | None = None  # a scratch file, never finished

    def open(self) -> list[dict]:
        self.output = durable.Hdf5Writer(self.path)
        if self.keep_sentences:
            self.sentences = durable.FileWriter(self.path, tag="sentences")
        return []

    def write(self, window: Window, line: Line, vectors: np.ndarray, attrs: dict | None = None) -> None:
        write_float32(self.output.file, window.key(line), vectors, attrs)
        self.output.check()  # a full disk stops the run at once, not at its end

    def record(self, window: Window, states) -> None:
        if self.sentences is not None:
            self.sentences.write("".join(json.dumps([line.text, window.key(line)]) + "\n" for line in window.lines))

    def finish(self, total: int) -> None:
        if self.sentences is not None:
            with durable.reading_back(self.path), open(self.sentences.close(), encoding="utf-8") as f:
                write_sentence_map(self.output.file, (tuple(json.loads(row)) for row in f))
        self.output.finish()  # from here the output is complete: abort() removes only the scratch file
        if self.sentences is not None:
            self.sentences.abort()

    def abort(self) -> None:
        for writer in (self.sentences, self.output):
            if writer is not None:
                writer.abort()


class ShardWriter:
    """The work directory ``OUTPUT.partial/``: a manifest, then one complete shard file per window,
    holding its sentences' vectors by position (``v/J``), their line numbers, texts, digest, and for
    stateful runs the LSTM states after it.

    role: "solo" (one process), "leader" (rank 0 of a group: prepares the directory, assembles the
    output) or "member" (another rank: writes its windows' shards only, never removes anything but
    its own half-written shard). patience: seconds the leader waits for shards written on other
    machines to show (a network filesystem)."""

    def __init__(self, output: str, manifest: dict, role: str = "solo", patience: float = 0.0) -> None:
        self.output = output
        self.work = work_dir_of(output)
        self.manifest = manifest
        self.role = role
        self.patience = patience
        self.done: list[dict] = []  # the complete shards found at the start, by start
        self.written = 0  # shards this process completed
        self.opened = False
        self.shard: durable.Hdf5Writer | None = None  # the window being written

    @property
    def complete(self) -> bool:
        """The output was assembled (and recorded as such) by a run killed before renaming it."""
        return bool(self.manifest.get("complete"))

    def open(self) -> list[dict]:
        self.manifest, self.done = open_work_dir(self.work, self.output, self.manifest, self.role)
        self.opened = True
        return self.done

    def saved_states(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The LSTM states after the last complete shard (stateful runs: their shards are a prefix)."""
        return saved_states(self.work, self.done)

    def _shard_of(self, window: Window):
        if self.shard is None:
            self.shard = durable.Hdf5Writer(os.path.join(self.work, shard_name(window.start)))
            self.shard.file.create_group("v")
        return self.shard.file

    def write(self, window: Window, line: Line, vectors: np.ndarray, attrs: dict | None = None) -> None:
        # by position in the window: keys (sentences with sentence keys) can be any text
        write_float32(self._shard_of(window)["v"], str(window.position(line)), vectors, attrs)
        self.shard.check()  # a full disk stops the run at once, not at the window's end

    def record(self, window: Window, states) -> None:
        import h5py

        f = self._shard_of(window)
        lines = window.lines
        f.create_dataset("lines", data=np.array([line.index for line in lines], dtype=np.int64))
        f.create_dataset("text", data=[line.text for line in lines], dtype=h5py.string_dtype())
        if lines[0].key is not None:  # FASTA records: their ids key the output
            f.create_dataset("keys", data=[line.key for line in lines], dtype=h5py.string_dtype())
        if states is not None:
            f.create_dataset("state_h", data=states[0].float().cpu().numpy())
            f.create_dataset("state_c", data=states[1].float().cpu().numpy())
        facts = {
            "start": window.start,
            "n": len(lines),
            "tokens": sum(len(line.tokens) for line in lines),
            "digest": lines_digest(lines),
            "first_line": lines[0].index,
            "last_line": lines[-1].index,
        }
        f.attrs.update(facts)
        shard, self.shard = self.shard, None
        shard.finish()  # whole on disk; only its record, written next, says: these sentences are done
        write_record(self.work, {"name": os.path.basename(shard.final), **facts})
        self.written += 1

    def finish(self, total: int) -> None:
        """The leader (or a solo run) assembles OUTPUT from the shards covering the input's ``total``
        sentences and renames it into place; another rank has nothing left to do."""
        if self.role == "member":
            return
        assembled = os.path.join(self.work, ASSEMBLING)
        if not self.complete:
            assemble(self.work, self.manifest, total, self.patience, assembled)
            # from here the assembled file is final: a kill before the rename is finished by --resume,
            # which checks it against this record first
            with durable.reading_back(assembled):
                record = assembled_record(assembled)
            self.manifest = {**self.manifest, "complete": True, "assembled": record}
            write_manifest(self.work, self.manifest)
        if os.path.exists(assembled):
            durable.move(assembled, self.output)
        remove_work_dir(self.work)

    def abort(self) -> None:
        # complete shards stay for --resume; only the window in progress is lost
        if self.shard is not None:
            self.shard.abort()
            self.shard = None
        nothing_done = self.opened and not self.complete and not self.done and not self.written
        if self.role == "solo" and nothing_done and os.path.isdir(self.work):
            remove_work_dir(self.work)  # nothing worth resuming: leave nothing behind
