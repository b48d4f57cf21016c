"""Running the app on uvicorn: the listening socket bound first (a port in use is a one-line error
before any model loads), and a graceful stop on SIGTERM, SIGINT and SIGHUP: stop accepting, answer
every request already received (its sentences are queued, and the model thread finishes the
queue), close the socket, and return normally so that the command exits 0.

Exposed on a network: the app runs behind :class:`~.guards.Guards` (API key, connections with a
request in progress, the body's read deadline: plain ASGI, not uvicorn's), TLS where a certificate
is given, and a connection that has not sent its first request's headers within the read timeout is
closed (uvicorn has no deadline there: :func:`_header_deadline`)."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from ..errors import ElmoFastError
from .batcher import Limits
from .composition import compose

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ElmoFastError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ElmoFastError(
            f"cannot listen on {host}:{port}: {e.strerror} (another server there? pick another --port)"
        ) from None
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, whose signal handlers stop it gracefully and are not raised again after
    (uvicorn re-raises them for the previous handlers, which would make a clean stop exit 143). A
    second signal stops it at once, dropping what is still in progress (a client stalled halfway
    through sending its request would otherwise hold the graceful stop for ever)."""

    stopped_by: signal.Signals | None = None

    def capture_signals(self):  # noqa: D102  (a context manager, as in uvicorn)
        import contextlib

        @contextlib.contextmanager
        def captured():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {}
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                    previous[sig] = signal.signal(sig, self._stop_signal)
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        return captured()

    def _stop_signal(self, signum: int, frame) -> None:
        if self.should_exit and self.stopped_by is not None:
            self.force_exit = True
        self.stopped_by = signal.Signals(signum)
        self.should_exit = True


@dataclass(frozen=True)
class Exposure:
    """How the server meets its clients: an API key (None: none needed), at most ``max_connections``
    with a request in progress, ``read_timeout`` seconds for a request's headers and for each piece
    of its body, and TLS from ``ssl_certfile`` (+ ``ssl_keyfile`` when the key is apart)."""

    api_key: str | None = None
    max_connections: int | None = None
    read_timeout: float | None = 30.0
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


def _header_deadline(seconds: float) -> type:
    """uvicorn's HTTP protocol (the one it would pick), closing a connection that has not sent a whole
    request head within ``seconds`` of opening (uvicorn's keep-alive timeout starts only after a
    first response)."""
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeaderDeadline(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_deadline = self.loop.call_later(seconds, self._head_overdue)

        def _head_overdue(self) -> None:
            if self.cycle is None and not self.transport.is_closing():  # no request head yet
                self.transport.close()

        def connection_lost(self, exc) -> None:
            self._head_deadline.cancel()
            super().connection_lost(exc)

    return HeaderDeadline


class EmbeddingServer:
    """The app, its batcher and uvicorn on a listening socket. ``load()`` (run on the model thread)
    returns the embedder; ``dim_of(embedder)`` is the size of its vectors; ``name`` what answers
    call the model. :meth:`run` serves until :meth:`stop` or a stop signal (main thread only)."""

    def __init__(
        self,
        sock: socket.socket,
        load: Callable[[], object],
        name: str,
        dim_of: Callable[[object], int],
        limits: Limits,
        max_request_tokens: int,
        log_level: str = "warning",
        exposure: Exposure = Exposure(),
    ) -> None:
        self.sock = sock
        host, port = sock.getsockname()[:2]
        scheme = "https" if exposure.ssl_certfile else "http"
        self.url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}"
        self.limits = limits
        served = compose(
            load,
            name,
            dim_of,
            limits,
            max_request_tokens,
            self._failed,
            self._ready,
            api_key=exposure.api_key,
            max_connections=exposure.max_connections,
            read_timeout=exposure.read_timeout,
        )
        self.metrics, self.info, self.batcher = served.metrics, served.info, served.batcher
        app = served.app
        http = "auto" if exposure.read_timeout is None else _header_deadline(exposure.read_timeout)
        config = uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            http=http,
            timeout_graceful_shutdown=None,
            timeout_keep_alive=30,
            ssl_certfile=exposure.ssl_certfile,
            ssl_keyfile=exposure.ssl_keyfile,
        )
        self.server = _Server(config)
        self.announce: Callable[[str], None] = lambda line: None

    def _failed(self, error: BaseException) -> None:
        self.server.should_exit = True

    def _ready(self) -> None:
        i, lim = self.info, self.limits
        self.announce(
            f"elmo-fast serve: ready on {self.url}: model {i.name!r} ({i.dim} dims); max batch "
            f"{lim.max_batch_size} sentences / {lim.max_batch_tokens} padded tokens, wait "
            f"{lim.max_wait_ms:g} ms"
        )

    def run(self) -> tuple[signal.Signals | None, bool]:
        """Serve until stopped: the signal that stopped it (None: :meth:`stop`), and whether a second
        signal cut the graceful stop short. Raises the model's error if it failed to load."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()
        if self.batcher.error is not None:
            raise self.batcher.error
        return self.server.stopped_by, self.server.force_exit

    def stop(self) -> None:
        """Stop as a signal would (from any thread): stop accepting, answer what was received."""
        self.server.should_exit = True


def run_server(
    load: Callable[[], object],
    name: str,
    dim_of: Callable[[object], int],
    limits: Limits,
    max_request_tokens: int,
    host: str,
    port: int,
    log_level: str = "warning",
    announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    exposure: Exposure = Exposure(),
) -> tuple[signal.Signals | None, bool]:
    """Listen on host:port (before the model loads: a port in use fails at once), serve until a stop
    signal (see :class:`EmbeddingServer.run`)."""
    sock = listen(host, port)
    server = EmbeddingServer(sock, load, name, dim_of, limits, max_request_tokens, log_level, exposure)
    server.announce = announce
    announce(f"elmo-fast serve: listening on {server.url}; loading the model")
    return server.run()
