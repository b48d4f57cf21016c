"""The transport's guards, which an ASGI middleware cannot hold (it sees a request only once its head
is whole): uvicorn's HTTP protocol (httptools' parser, else h11's) with

* a cap on open sockets (``max_connections``, text-embeddings-inference's
  ``--max-concurrent-requests``): a connection past it is answered 503 and closed at once, never
  queued;
* a total deadline for each request's head (``read_timeout``): from the moment the connection opens,
  or the first byte of the next request on a keep-alive connection, the whole head must be in within
  that many seconds, however it trickles; else the connection is closed (the body's deadline is the
  ASGI layer's, :class:`~.guards.Guards`, armed when the head is whole);
* an idle keep-alive timeout (``keep_alive_timeout``): a connection that sends nothing after an
  answer is closed after that many seconds (uvicorn's own timer);
* bytes that are not HTTP answered as every other error is, one line of JSON with a request id
  (uvicorn's own answer is plain text).

:func:`guarded_protocol` makes the class for one server; ``refused(kind)`` counts what it cuts off.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from .responses import error_body


def _base() -> type:
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return base


def _refusal(max_connections: int) -> bytes:
    body = error_body(
        f"the server has {max_connections} open connections, its --max-connections; retry shortly",
        "too_many_connections",
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _not_http(message: str) -> bytes:
    rid = uuid.uuid4().hex
    body = error_body(f"the request is not valid HTTP/1.1 ({message.rstrip('.')})", "malformed_request", rid)
    head = (
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\nx-request-id: {rid}\r\n\r\n"
    )
    return head.encode("ascii") + body


def guarded_protocol(
    max_connections: int | None,
    read_timeout: float | None,
    refused: Callable[[str], None] = lambda kind: None,
) -> type:
    """uvicorn's HTTP protocol class with the guards above (each off where None)."""
    base = _base()
    refusal = _refusal(max_connections) if max_connections is not None else b""

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if max_connections is not None and len(self.connections) > max_connections:
                self._refused = True
                refused("too_many_connections")
                transport.write(refusal)
                transport.close()
                return
            self._arm_head_deadline()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._head_timer is None and self._waiting_for_head():
                self._arm_head_deadline()  # the first byte of a request after an answer
            super().data_received(data)

        def _waiting_for_head(self) -> bool:
            cycle = self.cycle
            return cycle is None or cycle.response_complete

        def _arm_head_deadline(self) -> None:
            if read_timeout is not None:
                self._head_timer = self.loop.call_later(read_timeout, self._head_overdue)

        def _disarm_head_deadline(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_overdue(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and self._waiting_for_head():
                refused("head_timeout")
                self.transport.close()

        def on_headers_complete(self) -> None:  # httptools' callback
            self._disarm_head_deadline()
            super().on_headers_complete()

        def handle_events(self) -> None:  # h11's: its request heads arrive here
            super().handle_events()
            if not self._waiting_for_head():
                self._disarm_head_deadline()

        def send_400_response(self, msg: str) -> None:
            refused("malformed_request")
            self.transport.write(_not_http(msg))
            self.transport.close()

        def connection_lost(self, exc) -> None:
            self._disarm_head_deadline()
            super().connection_lost(exc)

    return GuardedProtocol
