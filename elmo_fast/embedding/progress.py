"""The record stage's counts and what the user sees of them: a progress bar of tokens (its total
counted by a background pass over the input file), the counts and rates a run returns, and its two
closing lines. In a group (torchrun) rank 0's bar and counts are the whole group's."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

import numpy as np

from ..errors import ElmoFastError
from ..textio import BOM, TextInput
from ..verification.first_use import fallbacks
from .input_guard import DEFAULT_MAX_LINE_LENGTH, bounded_lines
from .lines import Line
from .ranks import PROGRESS_EVERY

if TYPE_CHECKING:
    from .ranks import Ranks


# str.split()'s whitespace among ASCII bytes (with \x1c-\x1f, which bytes.split() does not split on)
_ASCII_SPACE = np.zeros(256, dtype=bool)
_ASCII_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True


_NOT_LETTERS = bytes(b for b in range(256) if not (65 <= b <= 90 or 97 <= b <= 122))


def _residues_in(block: bytes) -> int:
    """Residues in whole lines of a FASTA input: the letters of its lines that are not headers."""
    return sum(len(line.translate(None, _NOT_LETTERS)) for line in block.split(b"\n") if not line.startswith(b">"))


def _tokens_in(block: bytes) -> int:
    """Tokens in whole lines of the input, as read_sentences splits them."""
    if not block.isascii():  # other whitespace (U+00A0, U+3000, ...): str.split's own rules
        return len(block.decode("utf-8", "surrogateescape").split())
    space = _ASCII_SPACE[np.frombuffer(block, dtype=np.uint8)]
    if not space.size:
        return 0
    return int(np.count_nonzero(space[:-1] & ~space[1:])) + int(not space[0])  # where a token starts


class TokenCount:
    """Counts an input file's tokens in a background thread, for the progress bar's total: the run
    starts at once, and the bar learns its total when the count is done (a plain file reads at
    200 MB/s or more, so well before the end). Only regular files: a pipe cannot be read twice.
    A line over ``max_line_length`` characters ends the count without a total (the reader reports
    it), before it is held whole."""

    def __init__(
        self,
        path: str,
        tokenize: bool = False,
        max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH,
        fasta: bool = False,
    ) -> None:
        import threading

        self.path = path
        self.tokenize = tokenize
        self._count = _residues_in if fasta else _tokens_in  # a FASTA input's tokens are its residues
        # UTF-8 takes at most 4 bytes a character
        self._max_rest = None if max_line_length is None else 4 * (max_line_length + 2)
        self._max_line_length = max_line_length
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
                    self.total = total + self._count(rest)
                    return
                cut = chunk.rfind(b"\n") + 1  # whole lines, so that no character or token is cut in two
                if cut:
                    total += self._count(rest + chunk[:cut])
                    rest = chunk[cut:]
                else:
                    rest += chunk
                if self._max_rest is not None and len(rest) > self._max_rest:
                    return  # a line too long: the reader says so; the bar goes without a total
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
            for raw in bounded_lines(source.stream, self.path, self._max_line_length):
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


def progress_bar(total: int | None, initial: int, progress: bool | str):
    """A bar of tokens (sentences vary in length too much, once sorted by it, for an ETA in lines).
    progress="log": a line at most every 10 s instead of a redrawn bar (allennlp's
    --file-friendly-logging)."""
    from tqdm import tqdm

    if progress == "log":
        return tqdm(
            total=total,
            initial=initial,
            unit="tok",
            file=_LogLines(sys.stderr),
            mininterval=10.0,
            ascii=True,
            ncols=100,
        )
    return tqdm(total=total, initial=initial, unit="tok", disable=not progress, file=sys.stderr, dynamic_ncols=True)


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
    assembling = (
        f", {stats['assembly_seconds']:.2f} s of it assembling the output" if stats.get("assembly_seconds") else ""
    )
    items, tokens = ("proteins", "residues") if stats.get("input") == "fasta" else ("sentences", "tokens")
    first = (
        f"elmo-fast: {stats['sentences']:,} {items}, {stats['tokens']:,} {tokens}{resumed} -> {output} "
        f"({_size(stats['output_bytes'])}) in {stats['wall_seconds']:.2f} s ({stats['startup_seconds']:.2f} s "
        f"to start, {stats['seconds']:.2f} s to embed and write{assembling})"
    )
    ranks = stats.get("ranks", 1)
    if stats["steady_tokens_per_s"] is not None:
        summed = f"; the sum over {ranks} ranks" if ranks > 1 else ""
        rate = (
            f"{stats['steady_tokens_per_s']:,.0f} {tokens}/s steady (after the first batch, "
            f"{stats['warmup_seconds']:.2f} s with warm-up{summed})"
        )
    else:
        rate = f"{stats['tokens_per_s']:,.0f} {tokens}/s in one batch, warm-up included (too few for a steady rate)"
    twins = ", ".join(f"{op} on {where}" for op, places in stats.get("fallbacks", {}).items() for where in places)
    second = (
        f"elmo-fast: {rate}; backend {stats['backend']}, {'stateful' if stats['stateful'] else 'stateless'}, "
        f"{stats['dtype']}, {stats['device']}{f' x {ranks} ranks' if ranks > 1 else ''}"
        + (f"; the plain-PyTorch reference for ops that failed their first-use self-check: {twins}" if twins else "")
    )
    return [first, second]


class Progress:
    """The counts of a run as its batches are done, its bar, and (rank 0 of a group) the other ranks'
    progress added to the bar; a rank other than 0 publishes its own counts for rank 0 to read.

    ``initial_tokens``: those of windows an earlier run completed (the bar starts there); ``counter``:
    the background count of the input's tokens, the bar's total once known."""

    def __init__(
        self,
        show: bool | str,
        initial_tokens: int,
        counter: TokenCount | None,
        ranks: Ranks | None,
        oom_splits: Callable[[], int],
    ) -> None:
        self.counter = counter
        self.ranks = ranks
        self.oom_splits = oom_splits
        self.sentences = self.tokens = self.batches = 0
        self.start = time.perf_counter()
        self.first_done: float | None = None  # the end of the first batch (warm-up included)
        self.last_done: float | None = None
        self.first_tokens = 0
        self.others: list[dict] = []  # rank 0 of a group: the other ranks' final counts
        self._heard = {"tokens": 0, "at": float("-inf")}  # rank 0: the others' tokens, as last read
        self.bar = progress_bar(None, initial_tokens, show)

    def batch_done(self, batch: list[Line]) -> None:
        tokens = sum(len(line.tokens) for line in batch)
        self.tokens += tokens
        self.batches += 1
        self.last_done = time.perf_counter()
        if self.first_done is None:
            self.first_done, self.first_tokens = self.last_done, self.tokens
        self._learn_total()
        self.bar.update(tokens)
        self._hear_others()
        if self.ranks is not None:
            self.ranks.publish(self.counts())  # at most every PROGRESS_EVERY seconds

    def window_done(self, window) -> None:
        self.sentences += len(window.lines)

    def elsewhere(self) -> None:
        """A window done before, or another rank's."""
        self._hear_others()

    def end_of_input(self) -> None:
        """This rank's windows are done: in a group, wait for the others (rank 0's bar moving with
        their work meanwhile); then the bar's total, counted by now or about to be."""
        if self.ranks is not None:
            ranks = self.ranks
            ranks.publish(self.counts(final=True), force=True)
            ranks.arrive()
            while not ranks.everyone_arrived():
                self._hear_others()
                self._learn_total()
                time.sleep(0.1)
            ranks.wait()
            self._hear_others(force=True)
            self.others = ranks.others()  # their final counts (the work directory goes with the assembly)
        if self.counter is not None and self.bar.total is None:
            self.bar.total = self.counter.wait()
            self.bar.refresh()

    def close(self) -> None:
        if self.counter is not None:
            self.counter.stop()
        self.bar.close()

    def counts(self, final: bool = False) -> dict:
        """This process's counts; ``steady``: tokens/s after the first batch (None before a second)."""
        steady = None
        if self.first_done is not None and self.last_done > self.first_done:
            steady = (self.tokens - self.first_tokens) / (self.last_done - self.first_done)
        return {
            "tokens": self.tokens,
            "sentences": self.sentences,
            "steady": steady,
            "oom_splits": self.oom_splits(),
            "final": final,
        }

    def _learn_total(self) -> None:
        if self.bar.total is None and self.counter is not None and self.counter.total is not None:
            self.bar.total = self.counter.total

    def _hear_others(self, force: bool = False) -> None:
        # rank 0 adds the other ranks' tokens to its bar, whose rate is then the group's
        ranks = self.ranks
        if ranks is None or ranks.rank != 0 or ranks.world == 1:
            return
        now = time.monotonic()
        if not force and now - self._heard["at"] < PROGRESS_EVERY:
            return
        self._heard["at"] = now
        tokens = sum(r["tokens"] for r in ranks.others())
        if tokens > self._heard["tokens"]:
            self.bar.update(tokens - self._heard["tokens"])
            self._heard["tokens"] = tokens

    def stats(self, started: float, assembly_start: float | None, info: dict, resumed: int, output_bytes: int) -> dict:
        """What a run returns: counts, timings (from ``started``; ``assembly_start``: when a resumable
        run began to assemble its output), the settings in ``info``; on rank 0 of a group, the group's
        totals."""
        end = time.perf_counter()
        own = self.counts(final=True)
        ranks = self.ranks
        stats = {
            "sentences": self.sentences,
            "tokens": self.tokens,
            "seconds": end - self.start,
            "resumed_sentences": resumed,
            "oom_splits": own["oom_splits"],
            "wall_seconds": end - started,
            "startup_seconds": self.start - started,
            "warmup_seconds": (self.first_done - self.start) if self.first_done is not None else 0.0,
            "steady_tokens_per_s": own["steady"],
            "assembly_seconds": end - assembly_start if assembly_start is not None else 0.0,
            "output_bytes": output_bytes,
            "ranks": ranks.world if ranks is not None else 1,
            "rank": ranks.rank if ranks is not None else 0,
            # ops running their reference twins in this process (failed their first-use self-check)
            "fallbacks": {op: where for op, where in fallbacks().items() if where},
            **info,
        }
        if ranks is not None and ranks.rank == 0 and ranks.world > 1:  # the group's totals
            everyone = [own, *self.others]
            for key in ("sentences", "tokens", "oom_splits"):
                stats[key] = sum(r[key] for r in everyone)
            rates = [r["steady"] for r in everyone if r["steady"] is not None]
            stats["steady_tokens_per_s"] = sum(rates) if rates else None
        stats["tokens_per_s"] = stats["tokens"] / stats["seconds"] if stats["seconds"] > 0 else float("inf")
        return stats
