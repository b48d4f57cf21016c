"""The server's counters and histograms, written as Prometheus' text exposition format (version
0.0.4) by hand: a few dozen lines instead of a dependency. Updated from the event loop (requests)
and the model thread (batches), hence the lock."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable

from ..verification.first_use import fallbacks

PREFIX = "elmo_fast_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# sentences per batch, padded tokens per batch, seconds
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PADDED_TOKENS_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class Histogram:
    """Cumulative buckets (``le``), sum and count of observations."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: tuple[tuple[str, str], ...] = ()) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets + (math.inf,), self.counts):
            running += n
            out.append(f"{name}_bucket{_labels(labels + (('le', _number(bound)),))} {running}")
        out.append(f"{name}_sum{_labels(labels)} {_number(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class Metrics:
    """What ``GET /metrics`` shows. ``gauges`` are read when rendered (queue depth, readiness)."""

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]] | None = None) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.errors: dict[str, int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_SIZE_BUCKETS)
        self.padded_tokens = Histogram(PADDED_TOKENS_BUCKETS)
        self.batch_seconds = Histogram(SECONDS_BUCKETS)
        self.tokens = 0
        self.gauges = dict(gauges or {})

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge ``elmo_fast_<name>``, read whenever /metrics is rendered."""
        self.gauges[name] = (help_text, read)

    def request(self, endpoint: str, status: int, seconds: float, error_kind: str | None = None) -> None:
        with self._lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1
            if error_kind is not None:
                self.errors[error_kind] = self.errors.get(error_kind, 0) + 1
            hist = self.latency.get(endpoint)
            if hist is None:
                hist = self.latency[endpoint] = Histogram(SECONDS_BUCKETS)
            hist.observe(seconds)

    def error(self, kind: str) -> None:
        """An error not answered with a status (a client gone before its answer)."""
        with self._lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def batch(self, sentences: int, tokens: int, padded_tokens: int, seconds: float) -> None:
        with self._lock:
            self.batch_size.observe(sentences)
            self.padded_tokens.observe(padded_tokens)
            self.batch_seconds.observe(seconds)
            self.tokens += tokens

    def render(self) -> str:
        p = PREFIX
        with self._lock:
            lines = [
                f"# HELP {p}requests_total HTTP requests answered, by endpoint and status.",
                f"# TYPE {p}requests_total counter",
            ]
            lines += [
                f"{p}requests_total{_labels((('endpoint', e), ('status', str(s))))} {n}"
                for (e, s), n in sorted(self.requests.items())
            ]
            lines += [f"# HELP {p}errors_total Refused or failed requests, by kind.", f"# TYPE {p}errors_total counter"]
            lines += [f"{p}errors_total{_labels((('kind', k),))} {n}" for k, n in sorted(self.errors.items())]
            lines += [
                f"# HELP {p}request_latency_seconds Time from a request's arrival to its answer, by endpoint.",
                f"# TYPE {p}request_latency_seconds histogram",
            ]
            for e, hist in sorted(self.latency.items()):
                lines += hist.lines(f"{p}request_latency_seconds", (("endpoint", e),))
            lines += [f"# HELP {p}batch_size Sentences per model batch.", f"# TYPE {p}batch_size histogram"]
            lines += self.batch_size.lines(f"{p}batch_size")
            lines += [
                f"# HELP {p}batch_padded_tokens Padded tokens (sentences x longest) per model batch.",
                f"# TYPE {p}batch_padded_tokens histogram",
            ]
            lines += self.padded_tokens.lines(f"{p}batch_padded_tokens")
            lines += [f"# HELP {p}batch_seconds Model time per batch.", f"# TYPE {p}batch_seconds histogram"]
            lines += self.batch_seconds.lines(f"{p}batch_seconds")
            lines += [
                f"# HELP {p}tokens_total Tokens embedded.",
                f"# TYPE {p}tokens_total counter",
                f"{p}tokens_total {self.tokens}",
            ]
        for name, (help_text, read) in sorted(self.gauges.items()):
            lines += [f"# HELP {p}{name} {help_text}", f"# TYPE {p}{name} gauge", f"{p}{name} {_number(read())}"]
        lines += [
            f"# HELP {p}op_fallback 1 where the op failed its first-use self-check and runs its plain-PyTorch reference "
            "(right, slower), else 0.",
            f"# TYPE {p}op_fallback gauge",
        ]
        lines += [f"{p}op_fallback{_labels((('op', op),))} {int(bool(where))}" for op, where in fallbacks().items()]
        return "\n".join(lines) + "\n"
