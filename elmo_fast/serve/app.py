"""The HTTP routes (a Starlette app): ``POST /embed``, ``POST /v1/embeddings``, ``GET /health``,
``GET /metrics``. Requests are parsed and checked here (:mod:`.protocol`), their sentences go to
the :class:`~.batcher.Batcher`, their vectors come back encoded by :mod:`.responses`.

Every answer other than a 2xx is one line of JSON, ``{"error": {"message": ..., "type": kind}}``,
and is counted by kind in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..verification.first_use import fallbacks
from . import responses
from .batcher import Batcher, Job
from .metrics import CONTENT_TYPE, Metrics
from .protocol import RequestError, body_limit, parse_embed, parse_openai

log = logging.getLogger("elmo_fast.serve")

JSON = "application/json"
ROUTES = "POST /embed, POST /v1/embeddings, GET /health, GET /metrics"


@dataclass
class ModelInfo:
    """What the answers say of the model: its name and the size of its vectors (known once loaded)."""

    name: str
    dim: int = 0


class Service:
    """The endpoints, bound to one batcher and its metrics."""

    def __init__(self, batcher: Batcher, metrics: Metrics, info: ModelInfo, max_request_tokens: int) -> None:
        self.batcher = batcher
        self.metrics = metrics
        self.info = info
        self.max_request_tokens = max_request_tokens
        self.max_body = body_limit(max_request_tokens)

    # ---- helpers -----------------------------------------------------------------------------

    async def _body(self, request: Request) -> bytes:
        """The whole body, refused (413) as soon as it passes the limit that --max-request-tokens implies."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise self._too_big()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise self._too_big()
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_big(self) -> RequestError:
        return RequestError(
            413,
            "too_large",
            f"the request body is over {self.max_body} bytes, the most that "
            f"--max-request-tokens {self.max_request_tokens} allows",
        )

    async def _vectors(self, request: Request, sentences: list[list[str]], output: str) -> list:
        """Queue the sentences and wait for their vectors; a client that hangs up meanwhile takes its
        sentences out of the queue (ConnectionAbortedError)."""
        job: Job = self.batcher.submit(sentences, output)
        watcher = asyncio.ensure_future(request.receive())

        def hung_up(task: asyncio.Future) -> None:
            if not task.cancelled() and task.exception() is None and task.result().get("type") == "http.disconnect":
                self.batcher.cancel(job)

        watcher.add_done_callback(hung_up)
        try:
            return await job.future
        finally:
            watcher.remove_done_callback(hung_up)
            watcher.cancel()

    async def _answer(self, endpoint: str, request: Request, handle: Callable[[], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        try:
            response = await handle()
            kind = None
            self.batcher.answered()
        except RequestError as e:
            response = self.error_response(e)
            kind = e.kind
        except (ClientDisconnect, ConnectionAbortedError):
            self.metrics.error("disconnected")
            return Response(status_code=499)  # nobody reads it
        except Exception as e:  # noqa: BLE001  (one request's failure must not take the server down)
            log.exception("elmo-fast serve: %s failed", endpoint)
            response = self.error_response(RequestError(500, "internal", f"internal error: {type(e).__name__}: {e}"))
            kind = "internal"
        self.metrics.request(endpoint, response.status_code, time.perf_counter() - start, kind)
        return response

    @staticmethod
    def error_response(e: RequestError) -> Response:
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
        return Response(responses.error_body(e.message, e.kind), e.status, headers=headers, media_type=JSON)

    # ---- endpoints ---------------------------------------------------------------------------

    async def embed(self, request: Request) -> Response:
        async def handle() -> Response:
            req = parse_embed(await self._body(request), self.max_request_tokens)
            vectors = await self._vectors(request, req.sentences, req.output)
            if responses.wants_npy(request.headers.get("accept")):
                body, lengths = responses.embed_npy(vectors, req.output)
                headers = {"X-Model": self.info.name, "X-Dim": str(self.info.dim)}
                if lengths:
                    headers["X-Sentence-Lengths"] = ",".join(map(str, lengths))
                return Response(body, headers=headers, media_type=responses.NPY)
            return Response(responses.embed_json(vectors, self.info.name, self.info.dim), media_type=JSON)

        return await self._answer("/embed", request, handle)

    async def openai_embeddings(self, request: Request) -> Response:
        async def handle() -> Response:
            req = parse_openai(await self._body(request), self.max_request_tokens, self.info.dim)
            vectors = await self._vectors(request, req.sentences, "mean")
            body = responses.openai_json(vectors, self.info.name, req.tokens, req.encoding_format)
            return Response(body, media_type=JSON)

        return await self._answer("/v1/embeddings", request, handle)

    async def health(self, request: Request) -> Response:
        if self.batcher.ready.is_set():
            # an op that failed its first-use self-check runs its reference twin: right answers, slower; still
            # 200, "degraded" naming the ops and where (docs/serving.md)
            fallen_back = {op: where for op, where in fallbacks().items() if where}
            body = {"status": "degraded" if fallen_back else "ok", "model": self.info.name, "dim": self.info.dim}
            if fallen_back:
                body["fallbacks"] = fallen_back
            return Response(orjson.dumps(body), media_type=JSON)
        return self.error_response(RequestError(503, "not_ready", "the model is still loading", retry_after=1))

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def not_found(self, request: Request, exc: HTTPException) -> Response:
        message = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code == 404
            else f"{request.method} is not allowed on {request.url.path}"
        )
        kind = "not_found" if exc.status_code == 404 else "method_not_allowed"
        self.metrics.error(kind)
        return Response(
            responses.error_body(f"{message}; the routes are {ROUTES}", kind),
            exc.status_code,
            headers=exc.headers,
            media_type=JSON,
        )


def create_app(
    batcher: Batcher,
    metrics: Metrics,
    info: ModelInfo,
    max_request_tokens: int,
    on_failure: Callable[[BaseException], None],
    on_ready: Callable[[], None],
) -> Starlette:
    """The ASGI app. Its lifespan starts the model thread (which loads the model: /health answers 503
    until it is warm, then ``on_ready()`` is called; a model that fails to load is passed to
    ``on_failure``) and, at shutdown, lets it finish what is queued."""
    service = Service(batcher, metrics, info, max_request_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        batcher.start(asyncio.get_running_loop(), on_failure, on_ready)
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.stop)

    routes = [
        Route("/embed", service.embed, methods=["POST"]),
        Route("/v1/embeddings", service.openai_embeddings, methods=["POST"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/metrics", service.metrics_text, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: service.not_found})
    app.state.service = service
    return app
