"""What makes the app safe to put on a network, as one plain ASGI middleware that any ASGI
server runs (uvicorn here; a Ray Serve deployment wraps its app the same way):

* an API key: ``Authorization: Bearer KEY`` on every route but the open ones (``/health``, the API's
  description), compared in constant time (:func:`bearer_matches`); otherwise 401. The key is never
  logged nor echoed;
* a bound on the requests in progress (``max_in_progress``; a Ray Serve replica's
  ``max_connections``): one more gets 503 and ``Retry-After``, as a full queue does;
* a total deadline on reading a request's body (``read_timeout``, from the moment its head is read):
  a client that sends its headers and then stalls, or trickles its body, holds its slot no longer
  than that, then gets 408 and its connection is closed.

What only the transport can do (open sockets, the head's deadline, idle keep-alive, TLS) is
:mod:`.connections`' and :mod:`.tls`'. Every refusal is the server's usual one-line JSON error
(:func:`~.responses.error_body`), carrying the request's id (:mod:`.access`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from .access import ASGIApp, request_id
from .responses import error_body

#: routes answered without a key: a load balancer's or an orchestrator's probe carries none, and the
#: API's description holds no secret
OPEN_PATHS = ("/health", "/openapi.json", "/docs")


def bearer_matches(authorization: bytes | str | None, key: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer KEY``, compared in constant time (the
    time taken does not tell how much of a guess was right)."""
    if authorization is None:
        return False
    if isinstance(authorization, str):
        authorization = authorization.encode("latin-1", "replace")
    scheme, _, token = authorization.strip().partition(b" ")
    # compare_digest on equal-length digests: its time depends on neither the key's length nor the guess's
    return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), _digest(key.encode()))


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def route_path(scope: dict) -> str:
    """The request's path within the app: without the ``root_path`` of a server that mounts the app
    under a prefix (a Ray Serve ``route_prefix``, a proxy's), as the app's router matches it."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :] or "/"
    return path


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def send_error(
    send: Callable[[dict], Awaitable[None]],
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str] | None = None,
    rid: str | None = None,
) -> None:
    """A whole one-line JSON error response."""
    body = error_body(message, kind, rid)
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class Guards:
    """The ASGI middleware: ``Guards(app, api_key=..., max_in_progress=..., read_timeout=...)``;
    each is off when None. ``refused(kind)`` is called for each refusal (the server counts them)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None = None,
        max_in_progress: int | None = None,
        read_timeout: float | None = None,
        open_paths: tuple[str, ...] = OPEN_PATHS,
        refused: Callable[[str], None] = lambda kind: None,
    ) -> None:
        if api_key is not None and not api_key:
            raise ValueError("an empty API key would let anyone in")
        self.app = app
        self._api_key = api_key
        self.max_in_progress = max_in_progress
        self.read_timeout = read_timeout
        self.open_paths = open_paths
        self.refused = refused
        #: requests in progress
        self.active = 0

    def __repr__(self) -> str:  # the key stays out of every repr
        key = "set" if self._api_key is not None else None
        return f"Guards(api_key={key}, max_in_progress={self.max_in_progress}, read_timeout={self.read_timeout})"

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":  # lifespan (and websockets, which the app has none of)
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        if (
            self._api_key is not None
            and route_path(scope) not in self.open_paths
            and not bearer_matches(_header(scope, b"authorization"), self._api_key)
        ):
            self.refused("unauthorized")
            await send_error(
                send,
                401,
                "unauthorized",
                "this server needs an API key: send the header 'Authorization: Bearer KEY'",
                {"WWW-Authenticate": "Bearer"},
                rid,
            )
            return
        if self.max_in_progress is not None and self.active >= self.max_in_progress:
            self.refused("too_many_connections")
            await send_error(
                send,
                503,
                "too_many_connections",
                f"the server has {self.max_in_progress} requests in progress, its max_connections; retry shortly",
                {"Retry-After": "1"},
                rid,
            )
            return
        self.active += 1
        try:
            if self.read_timeout is None:
                await self.app(scope, receive, send)
            else:
                await _BodyDeadline(self, scope, receive, send).run()
        finally:
            self.active -= 1


class _BodyDeadline:
    """One request whose whole body must arrive within ``read_timeout`` seconds of its head (a total,
    not a bound on each piece: a client trickling a byte a second is cut off as one that stalls): a
    late client gets 408 (``Connection: close``), and the app sees it as gone (``http.disconnect``).
    Once the body is whole, ``receive`` is the server's own again (the app waits on it for a
    disconnect while the model runs: no deadline there)."""

    def __init__(self, guards: Guards, scope: dict, receive, send) -> None:
        self.guards, self.scope = guards, scope
        self._receive, self._send = receive, send
        self.body_done = False
        self.started = False
        self.timed_out = False
        self.deadline = asyncio.get_running_loop().time() + guards.read_timeout

    async def run(self) -> None:
        await self.guards.app(self.scope, self.receive, self.send)

    async def receive(self) -> dict[str, Any]:
        if self.body_done or self.timed_out:
            return await self._receive() if not self.timed_out else {"type": "http.disconnect"}
        try:
            left = self.deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise asyncio.TimeoutError
            message = await asyncio.wait_for(self._receive(), left)
        except asyncio.TimeoutError:
            self.timed_out = True
            self.guards.refused("read_timeout")
            if not self.started:
                await send_error(
                    self._send,
                    408,
                    "read_timeout",
                    f"the request's body did not arrive within {self.guards.read_timeout:g} s (--read-timeout)",
                    {"Connection": "close"},
                    request_id(self.scope),
                )
            return {"type": "http.disconnect"}
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_done = True
        return message

    async def send(self, message: dict) -> None:
        if self.timed_out:
            return  # answered already (408)
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
