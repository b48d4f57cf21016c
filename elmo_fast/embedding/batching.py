"""The batch stage: the input cut into windows (read ahead together, and with resume the unit of work
saved at once), each window's sentences sorted by length and cut into batches under a token budget."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

from ..errors import InputError
from .lines import Line, lines_digest


@dataclass
class Window:
    """A window of the input: its sentences, from the input's start-th on (0-based, counting the
    sentences read), and either the complete shard of an earlier run that holds them, or whether
    this rank embeds them. keyed_by_text: the output's keys are the sentences (else line numbers)."""

    start: int
    lines: list[Line]
    shard: dict | None
    mine: bool
    keyed_by_text: bool = False
    _positions: dict[int, int] = field(default_factory=dict, repr=False)

    def key(self, line: Line) -> str:
        """The output's name for this sentence's dataset (a FASTA record's: its id)."""
        if line.key is not None:
            return line.key
        return line.text if self.keyed_by_text else str(line.index)

    def position(self, line: Line) -> int:
        """Where ``line`` (one of this window's) stands in the window."""
        if not self._positions:
            self._positions.update((id(x), j) for j, x in enumerate(self.lines))
        return self._positions[id(line)]


def windows(
    lines: Iterator[Line],
    window: int,
    done: Sequence[dict],
    owns: Callable[[int], bool],
    name: str,
    work: str,
    keyed_by_text: bool = False,
) -> Iterator[Window]:
    """Cut the input into windows of at most ``window`` sentences around the complete shards of
    earlier runs (``done``, by start; each is checked against the input's lines, ``work`` named in the
    error when they differ). The k-th window still to embed (k from 0) is this rank's when ``owns(k)``."""
    position = 0
    k = 0
    shards = iter(done)
    upcoming = next(shards, None)
    while True:
        if upcoming is not None and upcoming["start"] == position:
            got = list(islice(lines, upcoming["n"]))
            if len(got) < upcoming["n"] or lines_digest(got) != upcoming["digest"]:
                raise InputError(
                    f"{name}: lines {upcoming['first_line'] + 1}..{upcoming['last_line'] + 1} are not "
                    f"those the interrupted run embedded into {upcoming['name']} (the input changed "
                    f"since); remove {work} to start over"
                )
            yield Window(position, got, upcoming, False, keyed_by_text)
            position += len(got)
            upcoming = next(shards, None)
            continue
        size = window if upcoming is None else min(window, upcoming["start"] - position)
        chunk = list(islice(lines, size))
        if not chunk:
            if upcoming is not None:
                raise InputError(
                    f"{name}: lines {upcoming['first_line'] + 1}..{upcoming['last_line'] + 1} are not "
                    f"those the interrupted run embedded into {upcoming['name']} (the input is shorter "
                    f"now); remove {work} to start over"
                )
            return
        yield Window(position, chunk, None, owns(k), keyed_by_text)
        position += len(chunk)
        k += 1


def batches(
    lines: Sequence[Line], batch_size: int, budget: Callable[[], int | None], by_length: bool = True
) -> Iterator[list[Line]]:
    """Batches of at most ``batch_size`` sentences and at most ``budget()`` padded tokens (sentences x
    longest; None: no bound), of ``lines`` sorted by length (``by_length``, ties in input order) or in
    input order. A sentence longer than the budget gets a batch of its own. The budget is read batch
    by batch: after an out-of-memory it shrinks for the rest of the window."""
    order = sorted(lines, key=lambda line: (len(line.tokens), line.index)) if by_length else lines
    batch: list[Line] = []
    longest = 0
    for line in order:
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
