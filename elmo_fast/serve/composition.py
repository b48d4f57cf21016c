"""The served app, whole, for whatever ASGI server runs it (uvicorn in :mod:`.server`, a Ray Serve
replica in :mod:`elmo_fast.ray.serve_deployment`): the batcher and its model thread, the metrics with
their gauges, the routes (:func:`~.app.create_app`), the guards around them (:class:`~.guards.Guards`)
and, outermost, the request id and access log (:class:`~.access.RequestLog`). Composed once here, so
that every way of serving answers alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .access import ASGIApp, RequestLog
from .app import create_app
from .batcher import Batcher, Limits
from .guards import Guards
from .info import ModelInfo
from .metrics import Metrics
from .protocol import RequestLimits


@dataclass
class ServedApp:
    """``app``: the guarded ASGI app (its lifespan starts the model thread); its ``batcher``, ``metrics``
    and ``info`` (the model's name, and its vectors' size once loaded)."""

    app: ASGIApp
    batcher: Batcher
    metrics: Metrics
    info: ModelInfo


def compose(
    load: Callable[[], object],
    name: str,
    dim_of: Callable[[object], int],
    limits: Limits,
    request_limits: RequestLimits,
    on_failure: Callable[[BaseException], None],
    on_ready: Callable[[], None],
    *,
    api_key: str | None = None,
    max_in_progress: int | None = None,
    read_timeout: float | None = None,
    ids_from_proxy: bool = False,
) -> ServedApp:
    """The app serving the model that ``load()`` returns (run on the model thread; ``dim_of(embedder)``
    is its vectors' size, ``name`` what answers call it). ``on_failure(error)`` / ``on_ready()`` are
    called on the event loop when the model fails to load / is warm. The guards are off where None.
    ``ids_from_proxy``: the server in front owns the request ids (:class:`~.access.RequestLog`)."""
    metrics = Metrics()
    info = ModelInfo(name)

    def load_and_measure():
        embedder = load()
        info.measure(embedder, dim_of(embedder))
        return embedder

    batcher = Batcher(load_and_measure, limits, metrics)
    metrics.gauge("queue_depth", "Requests waiting for a batch.", batcher.queue_depth)
    metrics.gauge("queued_sentences", "Sentences waiting for a batch.", batcher.queued_sentences)
    metrics.gauge("ready", "1 once the model is loaded and warm.", lambda: float(batcher.ready.is_set()))
    metrics.gauge("model_busy", "1 while the model thread runs a batch.", lambda: float(batcher.busy))
    guarded = Guards(
        create_app(batcher, metrics, info, request_limits, on_failure, on_ready),
        api_key=api_key,
        max_in_progress=max_in_progress,
        read_timeout=read_timeout,
        refused=metrics.error,
    )
    return ServedApp(RequestLog(guarded, ids_from_proxy=ids_from_proxy), batcher, metrics, info)
