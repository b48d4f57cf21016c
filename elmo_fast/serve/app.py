"""The HTTP routes (a Starlette app): ``POST /embed``, ``POST /v1/embeddings``, ``POST /tokenize``,
``GET /info``, ``GET /health``, ``GET /metrics``, ``GET /openapi.json``, ``GET /docs``. Requests are
parsed and checked here (:mod:`.protocol`), their sentences go to the :class:`~.batcher.Batcher`,
their vectors come back encoded by :mod:`.responses`.

Every answer other than a 2xx is one line of JSON, ``{"error": {"message": ..., "type": kind,
"request_id": ...}}``, and is counted by kind in the metrics; a 500 says nothing of what failed but the
id its traceback is logged under (:mod:`.access`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..verification.first_use import fallbacks
from . import api_docs, openapi, responses
from .access import log_internal, request_id
from .batcher import Batcher, Job
from .info import ModelInfo, info_body
from .metrics import CONTENT_TYPE, Metrics
from .protocol import RequestError, RequestLimits, parse_embed, parse_openai, parse_tokenize

log = logging.getLogger("elmo_fast.serve")

JSON = "application/json"
ROUTES = (
    "POST /embed, POST /v1/embeddings, POST /tokenize, GET /info, GET /health, GET /metrics, "
    "GET /openapi.json, GET /docs"
)


class Service:
    """The endpoints, bound to one batcher and its metrics."""

    def __init__(self, batcher: Batcher, metrics: Metrics, info: ModelInfo, request_limits: RequestLimits) -> None:
        self.batcher = batcher
        self.metrics = metrics
        self.info = info
        self.request_limits = request_limits
        self.max_body = request_limits.payload_bytes
        self._openapi = orjson.dumps(openapi.describe())
        self._docs = api_docs.render(openapi.describe()).encode()

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
        limits = self.request_limits
        why = (
            f"--payload-limit {limits.payload_limit}"
            if limits.payload_limit is not None
            else f"--payload-limit (by default what --max-request-tokens {limits.max_request_tokens} allows)"
        )
        return RequestError(413, "too_large", f"the request body is over {self.max_body} bytes, the most that {why}")

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

    async def _answer(
        self, endpoint: str, request: Request, handle: Callable[[], Awaitable[Response]], batched: bool = False
    ) -> Response:
        """``handle()``'s answer, or the error it raised as one line of JSON; counted in the metrics.
        ``batched``: the answer holds vectors (the batcher times its waits by when they go out)."""
        start = time.perf_counter()
        try:
            response = await handle()
            kind = None
            if batched:
                self.batcher.answered()
        except RequestError as e:
            response = self.error_response(e, request)
            kind = e.kind
        except (ClientDisconnect, ConnectionAbortedError):
            self.metrics.error("disconnected")
            return Response(status_code=499)  # nobody reads it
        except Exception as e:  # noqa: BLE001  (one request's failure must not take the server down)
            rid = request_id(request.scope)
            error_id = log_internal(e, endpoint, rid)
            response = Response(responses.internal_error_body(error_id, rid), 500, media_type=JSON)
            kind = "internal"
        self.metrics.request(endpoint, response.status_code, time.perf_counter() - start, kind)
        return response

    @staticmethod
    def error_response(e: RequestError, request: Request) -> Response:
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
        body = responses.error_body(e.message, e.kind, request_id(request.scope))
        return Response(body, e.status, headers=headers, media_type=JSON)

    # ---- endpoints ---------------------------------------------------------------------------

    async def embed(self, request: Request) -> Response:
        async def handle() -> Response:
            req = parse_embed(await self._body(request), self.request_limits)
            vectors = await self._vectors(request, req.sentences, req.output)
            headers = _truncated_header(req.truncated)
            if responses.wants_npy(request.headers.get("accept")):
                body, lengths = responses.embed_npy(vectors, req.output)
                headers.update({"X-Model": self.info.name, "X-Dim": str(self.info.dim)})
                if lengths:
                    headers["X-Sentence-Lengths"] = ",".join(map(str, lengths))
                return Response(body, headers=headers, media_type=responses.NPY)
            body = responses.embed_json(vectors, self.info.name, self.info.dim, req.truncated)
            return Response(body, headers=headers, media_type=JSON)

        return await self._answer("/embed", request, handle, batched=True)

    async def openai_embeddings(self, request: Request) -> Response:
        async def handle() -> Response:
            req = parse_openai(await self._body(request), self.request_limits, self.info.dim)
            vectors = await self._vectors(request, req.sentences, "mean")
            body = responses.openai_json(vectors, self.info.name, req.tokens, req.encoding_format)
            return Response(body, headers=_truncated_header(req.truncated), media_type=JSON)

        return await self._answer("/v1/embeddings", request, handle, batched=True)

    async def tokenize(self, request: Request) -> Response:
        async def handle() -> Response:
            req = parse_tokenize(await self._body(request), self.request_limits)
            body = responses.tokenize_json(req.texts, req.truncated)
            return Response(body, headers=_truncated_header(req.truncated), media_type=JSON)

        return await self._answer("/tokenize", request, handle)

    async def info_route(self, request: Request) -> Response:
        async def handle() -> Response:
            if not self.batcher.ready.is_set():
                raise RequestError(503, "not_ready", "the model is still loading", retry_after=1)
            body = await asyncio.to_thread(info_body, self.info, self.batcher.limits, self.request_limits)
            return Response(orjson.dumps(body), media_type=JSON)

        return await self._answer("/info", request, handle)

    def health_report(self) -> tuple[int, dict]:
        """The status of ``GET /health`` and its body: ``{"status": ..., ...}``; a state that is not
        ready answers 503. One place to add what the server should report of itself."""
        if not self.batcher.ready.is_set():
            raise RequestError(503, "not_ready", "the model is still loading", retry_after=1)
        # an op that failed its first-use self-check runs its plain-PyTorch reference: right answers, slower;
        # still 200, "degraded" naming the ops and where (docs/serving.md)
        fallen_back = {op: where for op, where in fallbacks().items() if where}
        body = {"status": "degraded" if fallen_back else "ok", "model": self.info.name, "dim": self.info.dim}
        if fallen_back:
            body["fallbacks"] = fallen_back
        return 200, body

    async def health(self, request: Request) -> Response:
        async def handle() -> Response:
            status, body = self.health_report()
            return Response(orjson.dumps(body), status, media_type=JSON)

        return await self._answer("/health", request, handle)

    async def metrics_text(self, request: Request) -> Response:
        return await self._answer(
            "/metrics", request, lambda: _ready(Response(self.metrics.render(), media_type=CONTENT_TYPE))
        )

    async def openapi_json(self, request: Request) -> Response:
        return await self._answer("/openapi.json", request, lambda: _ready(Response(self._openapi, media_type=JSON)))

    async def docs(self, request: Request) -> Response:
        return await self._answer("/docs", request, lambda: _ready(Response(self._docs, media_type="text/html")))

    async def not_found(self, request: Request, exc: HTTPException) -> Response:
        message = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code == 404
            else f"{request.method} is not allowed on {request.url.path}"
        )
        kind = "not_found" if exc.status_code == 404 else "method_not_allowed"
        self.metrics.error(kind)
        return Response(
            responses.error_body(f"{message}; the routes are {ROUTES}", kind, request_id(request.scope)),
            exc.status_code,
            headers=exc.headers,
            media_type=JSON,
        )


async def _ready(response: Response) -> Response:
    return response


def _truncated_header(truncated: tuple[int, ...]) -> dict[str, str]:
    """``X-Truncated``: the sentences cut to --max-request-tokens (--auto-truncate), when any."""
    return {"X-Truncated": ",".join(map(str, truncated))} if truncated else {}


def create_app(
    batcher: Batcher,
    metrics: Metrics,
    info: ModelInfo,
    request_limits: RequestLimits,
    on_failure: Callable[[BaseException], None],
    on_ready: Callable[[], None],
) -> Starlette:
    """The ASGI app. Its lifespan starts the model thread (which loads the model: /health answers 503
    until it is warm, then ``on_ready()`` is called; a model that fails to load is passed to
    ``on_failure``) and, at shutdown, lets it finish what is queued."""
    service = Service(batcher, metrics, info, request_limits)

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
        Route("/tokenize", service.tokenize, methods=["POST"]),
        Route("/info", service.info_route, methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/metrics", service.metrics_text, methods=["GET"]),
        Route("/openapi.json", service.openapi_json, methods=["GET"]),
        Route("/docs", service.docs, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: service.not_found})
    app.state.service = service
    return app
