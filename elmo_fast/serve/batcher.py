"""The dynamic batcher: concurrent requests' sentences merged into model batches.

One model thread owns the embedder (torch releases the GIL while it computes, so the event loop
keeps accepting and answering requests meanwhile). The event loop puts each request's sentences
into a shared queue (:meth:`Batcher.submit`, a few microseconds under a lock) and awaits a future;
the model thread takes a batch whenever it is free, embeds it, and hands the vectors back to the
loop in one ``call_soon_threadsafe`` per batch.

When the thread is free and fewer sentences wait than the clients it knows of (those of the batch
it just finished plus those that came meanwhile), it waits for them, up to ``max_wait_ms`` after
the later of its being free and the last answer going out: clients answered together come back
together, and waiting a few milliseconds for them keeps one batch of 32 from splitting into
batches of 25 and 7 that then stay out of step (a small batch costs almost as much as a full one
while memory bandwidth bounds it). A lone client is never made to wait: its previous batch held
one sentence, and one is there.

A batch is chosen around the oldest waiting sentence (so none waits for ever), adding the waiting
sentences nearest to it in length while the batch holds at most ``max_batch_size`` sentences and
``max_batch_tokens`` padded tokens (sentences x the longest); a sentence longer than that runs alone.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..output_shapes import shape_output
from .metrics import Metrics
from .protocol import RequestError

#: a batch that a warm-up runs through the model before the server says it is ready
WARMUP_SENTENCES = [
    ["The", "server", "warms", "up", "its", "model", "with", "this", "sentence", "."],
    ["And", "this", "one", "."],
]


@dataclass(frozen=True)
class Limits:
    """max_batch_size sentences and max_batch_tokens padded tokens per batch; max_wait_ms that a free
    model waits for expected company; max_queue requests waiting before new ones are refused (503)."""

    max_batch_size: int = 64
    max_batch_tokens: int = 4096
    max_wait_ms: float = 5.0
    max_queue: int = 1024


class Job:
    """One request's sentences on their way through the batcher; ``future`` gets the list of
    vectors in the request's order (set on the event loop)."""

    __slots__ = ("sentences", "output", "future", "results", "remaining", "undispatched", "cancelled")

    def __init__(self, sentences: list[list[str]], output: str, future: asyncio.Future) -> None:
        self.sentences = sentences
        self.output = output
        self.future = future
        self.results: list[Any] = [None] * len(sentences)
        self.remaining = len(sentences)  # not yet delivered (event loop only)
        self.undispatched = len(sentences)  # still in the queue (under the batcher's lock)
        self.cancelled = False


class _Item:
    __slots__ = ("job", "index", "length", "arrival")

    def __init__(self, job: Job, index: int, arrival: float) -> None:
        self.job = job
        self.index = index
        self.length = len(job.sentences[index])
        self.arrival = arrival


def select_batch(lengths: Sequence[int], max_size: int, max_tokens: int) -> list[int]:
    """Which waiting sentences form the next batch: indices into ``lengths`` (token counts, oldest
    first). Index 0 is always taken; then, while the batch holds at most ``max_size`` sentences and
    ``max_size`` x longest <= ``max_tokens``, the sentence whose inclusion wastes the fewest padded
    tokens (a shorter one wastes its shortfall, a longer one its excess times the batch size; ties
    to the older). Returned sorted."""
    n = len(lengths)
    longest = max(lengths, default=0)
    if n <= max_size and n * longest <= max_tokens:
        return list(range(n))
    order = sorted(range(n), key=lambda i: (lengths[i], i))
    lo = hi = order.index(0)
    top = lengths[0]
    count = 1
    while count < max_size:
        best = None  # (waste, age rank, side)
        if lo > 0:
            i = order[lo - 1]
            if (count + 1) * top <= max_tokens:
                best = (top - lengths[i], i, -1)
        if hi < n - 1:
            i = order[hi + 1]
            if (count + 1) * lengths[i] <= max_tokens:
                cand = ((lengths[i] - top) * count, i, 1)
                best = cand if best is None or cand < best else best
        if best is None:
            break
        if best[2] < 0:
            lo -= 1
        else:
            hi += 1
            top = lengths[best[1]]
        count += 1
    return sorted(order[lo : hi + 1])


class Batcher:
    """Owns the model thread: ``load()`` (run there) returns an object with ElmoEmbedder's
    ``embed_batch(sentences) -> [array [L + 1, T_i, D]]``; a warm-up batch runs before ``ready``."""

    def __init__(self, load: Callable[[], Any], limits: Limits, metrics: Metrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.embedder: Any = None
        self.busy = False  # the model thread is running a batch
        self._load = load
        self._cond = threading.Condition()
        self._pending: list[_Item] = []
        self._queued_requests = 0
        self._expected = 1  # clients that are likely to send again soon (see the module docstring)
        self._free_since = 0.0
        self._last_answer = 0.0
        self._stopping = False
        self._tokens_per_s = 0.0  # recent rate, for Retry-After
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_failure: Callable[[BaseException], None] | None = None
        self._on_ready: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="elmo-fast-model", daemon=True)

    # ---- event loop side ---------------------------------------------------------------------

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        on_failure: Callable[[BaseException], None],
        on_ready: Callable[[], None] = lambda: None,
    ) -> None:
        """Start the model thread: it loads the model, warms it up, sets ``ready`` and calls
        ``on_ready()``; a failure to load is kept in ``error`` and passed to ``on_failure``
        (both called on the loop)."""
        self._loop = loop
        self._on_failure = on_failure
        self._on_ready = on_ready
        self._thread.start()

    def submit(self, sentences: list[list[str]], output: str) -> Job:
        """Queue a request's sentences (called on the event loop); a 503 when the model is not ready,
        the server is stopping, or ``max_queue`` requests already wait."""
        if not self.ready.is_set():
            raise RequestError(503, "not_ready", "the model is still loading; try again shortly", retry_after=1)
        job = Job(sentences, output, self._loop.create_future())
        now = time.perf_counter()
        with self._cond:
            if self._stopping:
                raise RequestError(503, "shutting_down", "the server is shutting down", retry_after=1)
            if self._queued_requests >= self.limits.max_queue:
                raise RequestError(
                    503,
                    "queue_full",
                    f"the queue is full ({self._queued_requests} requests wait, "
                    f"--max-queue {self.limits.max_queue}); retry later",
                    retry_after=self._retry_after(),
                )
            self._pending.extend(_Item(job, i, now) for i in range(len(sentences)))
            self._queued_requests += 1
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client is gone: its sentences leave the queue (those in a running batch finish, and
        their vectors are dropped), and its future fails with ``ConnectionAbortedError``."""
        self._withdraw(job)
        if not job.future.done():
            job.future.set_exception(ConnectionAbortedError("the client disconnected"))

    def _withdraw(self, job: Job) -> None:
        """Take a job's waiting sentences out of the queue."""
        with self._cond:
            job.cancelled = True
            if job.undispatched:
                self._pending = [it for it in self._pending if it.job is not job]
                job.undispatched = 0
                self._queued_requests -= 1

    def answered(self) -> None:
        """A request's answer is ready to go out (called on the event loop, once it is encoded)."""
        with self._cond:
            self._last_answer = time.perf_counter()

    def queue_depth(self) -> int:
        """Requests with sentences still waiting for a batch."""
        return self._queued_requests

    def queued_sentences(self) -> int:
        return len(self._pending)

    def stop(self) -> None:
        """Refuse new requests, let the model thread finish what is queued, and wait for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _retry_after(self) -> int:
        """Seconds until the queue has likely drained (at least 1)."""
        tokens = sum(it.length for it in self._pending)
        rate = self._tokens_per_s
        return max(1, math.ceil(tokens / rate)) if rate > 0 else 1

    def _deliver(self, results: list[tuple[_Item, Any]]) -> None:
        """On the event loop: each vector to its request; a request whose last vector came is answered."""
        for item, result in results:
            job = item.job
            if job.future.done():  # cancelled, or failed by an earlier sentence
                continue
            if isinstance(result, BaseException):  # the request fails: its other sentences need not run
                self._withdraw(job)
                job.future.set_exception(result)
                continue
            job.results[item.index] = result
            job.remaining -= 1
            if job.remaining == 0:
                job.future.set_result(job.results)

    # ---- model thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.embedder = self._load()
            if not self._stopping:
                self.embedder.embed_batch(WARMUP_SENTENCES)
                self.embedder.embed_batch(WARMUP_SENTENCES[:1])
        except BaseException as e:  # noqa: BLE001  (reported to the loop, which stops the server)
            self.error = e
            self._call_on_loop(self._on_failure, e)
            return
        self.ready.set()
        self._call_on_loop(self._on_ready)
        self._free_since = time.perf_counter()
        while (batch := self._take()) is not None:
            self._run_batch(batch)

    def _call_on_loop(self, fn: Callable | None, *args: Any) -> None:
        if fn is None or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody waits for this any more
            pass

    def _enough(self) -> bool:
        """Whether the waiting sentences make a batch without waiting for more."""
        pending = self._pending
        n = len(pending)
        want = min(self.limits.max_batch_size, max(1, self._expected))
        if n >= want:
            return True
        return n * max(it.length for it in pending) >= self.limits.max_batch_tokens

    def _take(self) -> list[_Item] | None:
        """The next batch, once it is worth running; None when stopping and nothing is left."""
        max_wait = self.limits.max_wait_ms / 1000.0
        with self._cond:
            while True:
                if not self._pending:
                    if self._stopping:
                        return None
                    self._cond.wait()
                    continue
                if self._stopping or self._enough():
                    break
                # the oldest sentence waits for company at most max_wait beyond the time the model
                # was free to take it, or the last answer went out (the clients answered last come
                # back after their answers, which take a while to encode when they are large)
                since = max(self._pending[0].arrival, self._free_since, self._last_answer)
                wait = since + max_wait - time.perf_counter()
                if wait <= 0:
                    break
                self._cond.wait(wait)
            pending = self._pending
            chosen = select_batch(
                [it.length for it in pending], self.limits.max_batch_size, self.limits.max_batch_tokens
            )
            taken = set(chosen)
            batch = [pending[i] for i in chosen]
            self._pending = [it for i, it in enumerate(pending) if i not in taken]
            for item in batch:
                job = item.job
                job.undispatched -= 1
                if job.undispatched == 0:
                    self._queued_requests -= 1
            # the clients of this batch, and those still waiting, will likely all want the next one
            self._expected = len(batch) + len(self._pending)
            return batch

    def _run_batch(self, batch: list[_Item]) -> None:
        start = time.perf_counter()
        self.busy = True
        try:
            results = self._embed(batch)
        finally:
            self.busy = False
        seconds = time.perf_counter() - start
        tokens = sum(it.length for it in batch)
        self.metrics.batch(len(batch), tokens, len(batch) * max(it.length for it in batch), seconds)
        if seconds > 0:
            rate = tokens / seconds
            self._tokens_per_s = rate if self._tokens_per_s == 0 else 0.8 * self._tokens_per_s + 0.2 * rate
        with self._cond:
            self._free_since = time.perf_counter()
            # those that came while the model was busy are company too (see _take); counted before
            # the answers go out, since this batch's clients may be back at once after them
            self._expected = max(self._expected, len(batch) + len(self._pending))
        self._call_on_loop(self._deliver, results)

    def _embed(self, batch: list[_Item]) -> list[tuple[_Item, Any]]:
        """Vectors for a batch; a batch that fails is halved until the failure is one sentence's,
        so that the others of the batch are still answered."""
        try:
            arrays = self.embedder.embed_batch([it.job.sentences[it.index] for it in batch])
            return [(it, shape_output(a, it.job.output)) for it, a in zip(batch, arrays)]
        except Exception as e:  # noqa: BLE001  (one sentence's failure is its request's 500, nobody else's)
            if len(batch) == 1:
                return [(batch[0], e)]
            mid = len(batch) // 2
            return self._embed(batch[:mid]) + self._embed(batch[mid:])
