"""The outermost layer of the served app (plain ASGI, so that uvicorn and a Ray Serve replica run it
alike): every request gets an id, every answer carries it, every request is one access log line, and
nothing a failure says reaches the client.

* the request id: the client's ``X-Request-Id`` when it is a sane one (1 to 128 letters, digits and
  ``-_.:@/+=``), else a new one; sent back as ``X-Request-Id`` on every answer, in every error body
  (``"request_id"``) and on the access log line, so that a client's report finds the server's line;
* the access log: ``elmo_fast.serve.access`` at INFO (shown with ``--log-level info``): client,
  method, path, status, bytes, seconds, request id; never a header (an API key stays out of it);
* a failure that escaped the routes (they answer their own, :meth:`~.app.Service._answer`) is a 500
  whose body is only an id (:func:`internal_error`), its traceback logged server-side under that id.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable

from .responses import internal_error_body

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

HEADER = b"x-request-id"
#: the scope's key for the request's id (read with :func:`request_id`)
SCOPE_KEY = "elmo_fast.request_id"
_SANE = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")

log = logging.getLogger("elmo_fast.serve")
access_log = logging.getLogger("elmo_fast.serve.access")


def request_id(scope: dict) -> str | None:
    """The id of the request a scope is for (None outside this layer)."""
    return scope.get(SCOPE_KEY)


def _incoming_id(scope: dict, any_id: bool = False) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == HEADER:
            if any_id or _SANE.fullmatch(value):
                return value.decode("latin-1")
            break
    return uuid.uuid4().hex


def _printable(value: object) -> str:
    """A client's text as one safe log field: control characters and quotes escaped."""
    return repr(str(value))[1:-1].replace('"', '\\"')


def new_error_id() -> str:
    return uuid.uuid4().hex[:16]


def log_internal(error: BaseException, where: str, rid: str | None) -> str:
    """Log a failure's traceback under a new id (returned), for the 500 that names only the id."""
    error_id = new_error_id()
    log.error(
        "elmo-fast serve: internal error %s in %s (request %s)",
        error_id,
        _printable(where),
        _printable(rid),
        exc_info=error,
    )
    return error_id


async def internal_error(send: Callable[[dict], Awaitable[None]], error_id: str, rid: str | None) -> None:
    body = internal_error_body(error_id, rid)
    await send(
        {
            "type": "http.response.start",
            "status": 500,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestLog:
    """``RequestLog(app)``: the request id, the access log line and the last-resort 500 (see the module).
    ``ids_from_proxy``: the server in front owns the ids (Ray Serve's proxy passes each request's id in
    ``X-Request-Id``, whatever it is, and answers with it): the id it passes is used as it is, and the
    answers' header is left to it."""

    def __init__(self, app: ASGIApp, ids_from_proxy: bool = False) -> None:
        self.app = app
        self.ids_from_proxy = ids_from_proxy

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope, self.ids_from_proxy)
        scope[SCOPE_KEY] = rid
        start = time.perf_counter()
        answer = {"status": 0, "bytes": 0}
        raw_id = rid.encode("latin-1")

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                if not self.ids_from_proxy:
                    headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != HEADER]
                    message = {**message, "headers": [*headers, (HEADER, raw_id)]}
            elif message["type"] == "http.response.body":
                answer["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as e:  # noqa: BLE001  (one request's failure must not take the server down)
            error_id = log_internal(e, f"{scope.get('method')} {scope.get('path')}", rid)
            if not answer["status"]:
                await internal_error(send_with_id, error_id, rid)
        finally:
            if access_log.isEnabledFor(logging.INFO):
                client = scope.get("client") or ("-", 0)
                access_log.info(
                    '%s:%s "%s %s HTTP/%s" %d %d %.4fs request_id=%s',
                    client[0],
                    client[1],
                    _printable(scope.get("method")),
                    _printable(scope.get("path")),
                    scope.get("http_version", "1.1"),
                    answer["status"],
                    answer["bytes"],
                    time.perf_counter() - start,
                    _printable(rid),
                )
