"""Corpus-scale ``embed_file``: a file of sentences into allennlp's HDF5 layout, as a pipeline

    read (:mod:`.lines`) -> batch (:mod:`.batching`) -> embed (:mod:`.batch_runner`)
        -> write (:mod:`.writers`) -> record (:mod:`.writers`, :mod:`.progress`)

Lines are read lazily and checked as they arrive. A bounded window of sentences is read ahead,
sorted by length and cut into batches under a token budget; every result goes to disk as soon as
its batch is done, so memory does not grow with the corpus (only ``sentence_to_index``, one JSON
string in allennlp's layout, is built whole at the end). Every file is written through
:mod:`elmo_fast.durable`, and a run holds its output's lock from its first check to its end
(:mod:`.output_lock`: one run per output). Three ways to write:

* plain (default): one HDF5 file under a temporary name beside the output, renamed into place
  when complete (:class:`~.writers.PlainWriter`);
* resumable (``resume=True``): a work directory ``OUTPUT.partial/`` of one complete shard per window,
  continued by a later ``resume=True`` run and assembled into the same file at the end
  (:class:`~.writers.ShardWriter`, :mod:`.work_area`);
* a group (``distributed=True``, ``torchrun``): the resumable way, each rank embedding its share
  of the windows into the same work directory, rank 0 assembling (:mod:`.ranks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from ..errors import ElmoFastError, Param
from . import ranks as group
from .batch_runner import BatchRunner, Embedder
from .batching import Window, batches, windows
from .fasta import IdRule, ResidueRule, read_fasta
from .input_guard import kind_of, rereadable
from .layout import per_protein
from .leftovers import stale_temp_files
from .lines import Line, read_sentences, refuse_duplicates
from .options import EmbedOptions
from .output_checks import check_output, check_output_path, finished_already
from .output_lock import hold_output
from .progress import Progress, TokenCount, summary_lines
from .work_area import new_manifest, work_dir_of
from .writers import PlainWriter, ShardWriter, Writer


def embed_corpus(
    embedder: Embedder, input_file: str | os.PathLike | IO, output_file_path: str | os.PathLike, options: EmbedOptions
) -> dict[str, Any]:
    """The body of :meth:`ElmoEmbedder.embed_file` (see there); returns the run's counts and timings."""
    with contextlib.ExitStack() as held:
        check_output_path(os.fspath(output_file_path))  # what the lock file needs: its folder, a name that fits
        if not options.distributed:  # (a group's rank 0 takes it as it starts the group: group.start_group)
            held.enter_context(hold_output(output_file_path))
        return _embed_corpus(embedder, input_file, output_file_path, options, held)


def _embed_corpus(
    embedder: Embedder,
    input_file: str | os.PathLike | IO,
    output_file_path: str | os.PathLike,
    options: EmbedOptions,
    held: contextlib.ExitStack,
) -> dict[str, Any]:
    run = CorpusRun(embedder, input_file, output_file_path, options)  # every check, before any work
    try:
        if not run.begin(held):  # a resumed run that had finished: nothing to do
            return run.nothing()
        writer, runner, progress = run.writer, run.runner, run.progress
        for window in run.windows():  # read
            if not window.mine:  # done before, or another rank's
                progress.elsewhere()
                continue
            for batch in run.batches(window):  # batch
                for line, vectors in zip(batch, runner.embed(batch)):  # embed
                    writer.write(window, line, *per_protein(vectors, run.options.per_protein))  # write
                progress.batch_done(batch)
            writer.record(window, run.states())  # record
            progress.window_done(window)
        run.finish()
    except BaseException:
        run.abort()
        raise
    return run.report()


def _refusal_in_a_group(why: str, *what: str | Param) -> ElmoFastError:
    return ElmoFastError(*what, f" cannot be split among the ranks of a group (torchrun): {why}")


class CorpusRun:
    """One ``embed_file`` run: its settings resolved and checked, then what joins the stages (the
    writer, the batch runner, the progress), begun, finished or aborted."""

    writer: Writer
    runner: BatchRunner
    progress: Progress

    def __init__(
        self,
        embedder: Embedder,
        input_file: str | os.PathLike | IO,
        output_file_path: str | os.PathLike,
        options: EmbedOptions,
    ) -> None:
        self.started = time.perf_counter() if options.started is None else options.started
        self.embedder = embedder
        self.bilm = bilm = embedder.elmo_bilm
        self.input_file = input_file
        self.output = output = os.fspath(output_file_path)
        self.name = (
            os.fspath(input_file)
            if isinstance(input_file, (str, os.PathLike))
            else str(getattr(input_file, "name", "<input>"))
        )
        self.rereadable = rereadable(input_file)  # else opened once, read once (input_guard)
        self.ranks: group.Ranks | None = None
        if options.distributed:
            if bilm.stateful:
                raise _refusal_in_a_group(
                    "the LSTM states flow from each batch to the next in input order, so one "
                    "process must embed it all; run it without torchrun",
                    "a stateful run (",
                    Param("stateful", True),
                    ")",
                )
            if not self.rereadable:
                raise _refusal_in_a_group(
                    "every rank reads the input itself; give a file on a filesystem that every rank shares",
                    f"input from {kind_of(input_file)} ({self.name})",
                )
            self.ranks = group.Ranks.join(work_dir_of(output))
            # the work directory is how ranks write, and how a restarted group continues
            options = dataclasses.replace(
                options, resume=True, progress=options.progress if self.ranks.rank == 0 else False
            )
        self.rank = 0 if self.ranks is None else self.ranks.rank
        self.options = options = options.for_model(embedder.batch_size, bilm.stateful)
        check_output(output, options.overwrite, options.resume)
        if embedder.device.type == "cuda" and bilm.backend == "fast":
            from ..bilm.ops import require_cuda_kernels

            require_cuda_kernels()  # now, not at the first batch after the output was begun
        if self.rank == 0:
            removed, left = stale_temp_files(output)
            if options.progress:
                for path in removed:
                    print(f"elmo-fast: removed {path}, left by a run that was killed", file=sys.stderr)
                for what in left:
                    print(f"elmo-fast: note: {what}", file=sys.stderr)
        self.id_rule = IdRule(options.fasta_split_char, options.fasta_id_field) if options.fasta else None
        self.lines = self.sentences()  # the input is opened now: a missing file fails before any output
        self.info = {
            "backend": bilm.backend,
            "stateful": bilm.stateful,
            "dtype": str(bilm.compute_dtype).replace("torch.", ""),
            "device": str(embedder.device),
            **({"input": "fasta"} if options.fasta else {}),
        }
        self.writer = None  # type: ignore[assignment]
        self.progress = None  # type: ignore[assignment]
        self.done: list[dict] = []  # the complete shards of an interrupted run, by start
        self.total = 0  # the input's sentences, once read to its end
        self.assembly_start: float | None = None

    def sentences(self) -> Iterator[Line]:
        """The input's sentences, from its start (a path is opened again)."""
        o = self.options
        if o.fasta:
            rule = ResidueRule(o.fasta_stop or "drop", o.fasta_gaps or "refuse")
            return read_fasta(self.input_file, self.id_rule, o.max_line_length, rule, self.output)
        lines = read_sentences(self.input_file, o.encoding_errors, o.skip_empty, o.tokenize, o.max_line_length)
        return refuse_duplicates(lines, self.output) if o.use_sentence_keys else lines

    def begin(self, held: contextlib.ExitStack) -> bool:
        """Open the writer (a plain output, or the work directory of a resumable run or a group) and
        what follows its work; False: this resumed run had finished already, nothing is left to do.
        ``held``: where a group's rank 0 puts the output's lock, for the run."""
        o, output = self.options, self.output
        if not o.resume:
            self.writer = PlainWriter(output, o.keeps_sentences)  # named first: abort() knows what to remove
            self.writer.open()
        else:
            manifest = new_manifest(self.embedder, self.name, o)
            if self.ranks is not None:
                self.writer = group.start_group(
                    self.ranks, output, manifest, self.lines, self.name, o.overwrite, o.progress, held
                )
            elif finished_already(output, manifest, self.lines, self.name, o.overwrite, self.rereadable):
                if o.progress:
                    print(f"elmo-fast: {output} is complete already: nothing to resume", file=sys.stderr)
            else:
                self.writer = writer = ShardWriter(output, manifest)
                writer.open()
                if writer.complete:  # killed between assembling the file and renaming it: finish that
                    writer.finish(0)
                    self.writer = None
            if self.writer is None:
                return False
            self.done = self.writer.done
            if self.rereadable:
                self.lines = self.sentences()  # from the start again, if it was read
            if self.bilm.stateful:
                self._restore_states(self.writer)
        self.runner = BatchRunner(self.embedder, o.output_format, o.max_tokens_per_batch)
        counter = (
            TokenCount(self.name, o.tokenize, o.max_line_length, fasta=o.fasta)
            if self.rereadable and o.progress and os.path.isfile(self.name)
            else None
        )
        self.progress = Progress(
            o.progress, sum(s["tokens"] for s in self.done), counter, self.ranks, lambda: self.runner.oom_splits
        )
        return True

    def _restore_states(self, writer: ShardWriter) -> None:
        done = self.done
        if any(s["start"] != sum(d["n"] for d in done[:i]) for i, s in enumerate(done)):
            raise ElmoFastError(
                f"{writer.work}: its shards leave gaps, so the LSTM states to continue from are "
                f"unknown (a stateful run leaves none); remove {writer.work} to start over"
            )
        if (states := writer.saved_states()) is not None:
            self.bilm.set_states(states)

    def windows(self) -> Iterator[Window]:
        owns = self.ranks.owns if self.ranks is not None else (lambda k: True)
        for window in windows(
            self.lines,
            self.options.window,
            self.done,
            owns,
            self.name,
            work_dir_of(self.output),
            self.options.use_sentence_keys,
        ):
            self.total = window.start + len(window.lines)
            yield window

    def batches(self, window: Window) -> Iterator[list[Line]]:
        o = self.options
        return batches(window.lines, o.batch_size, self.runner.budget, by_length=o.bucketing)

    def states(self):
        """The LSTM states after the last batch (stateful runs; a resume continues from them)."""
        return self.bilm.get_states() if self.bilm.stateful else None

    def finish(self) -> None:
        self.progress.end_of_input()
        self.progress.close()
        if self.options.resume:
            self.assembly_start = time.perf_counter()
        self.writer.finish(self.total)

    def abort(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.writer is not None:
            self.writer.abort()

    def nothing(self) -> dict[str, Any]:
        """The counts of a run that found nothing left to do."""
        return {
            "sentences": 0,
            "tokens": 0,
            "seconds": 0.0,
            "tokens_per_s": 0.0,
            "resumed_sentences": 0,
            "oom_splits": 0,
            **self.info,
        }

    def report(self) -> dict[str, Any]:
        """The run's counts and timings, and its two closing lines (with progress)."""
        stats = self.progress.stats(
            self.started,
            self.assembly_start,
            self.info,
            sum(s["n"] for s in self.done),
            os.path.getsize(self.output) if self.rank == 0 else 0,
        )
        if self.options.progress:
            for line in summary_lines(stats, self.output):
                print(line, file=sys.stderr)
        return stats
