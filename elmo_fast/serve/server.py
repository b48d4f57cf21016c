"""Running the app on uvicorn: the listening socket bound first (a port in use is a one-line error
before any model loads), and a graceful stop on SIGTERM, SIGINT and SIGHUP: stop accepting, answer
every request already received (its sentences are queued, and the model thread finishes the
queue), close the socket, and return normally so that the command exits 0.

Exposed on a network: the app runs behind :class:`~.guards.Guards` (API key, the body's total read
deadline: plain ASGI), uvicorn's protocol behind :mod:`.connections` (a cap on open sockets, the head's
total deadline, idle keep-alive), and TLS with the server's own context (:mod:`.tls`), its handshake
held to the read deadline too."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn

from ..errors import ElmoFastError
from .batcher import Limits
from .composition import compose
from .connections import guarded_protocol
from .defaults import KEEP_ALIVE_TIMEOUT, MAX_CONNECTIONS, READ_TIMEOUT
from .protocol import RequestLimits

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
    #: seconds a client has for its TLS handshake (asyncio's default is 60)
    handshake_timeout: float | None = None

    async def startup(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        if self.config.ssl is None or self.handshake_timeout is None:
            await super().startup(sockets=sockets)
            return
        # uvicorn passes no handshake timeout to create_server: give the loop's one ours while it listens
        create_server = loop.create_server
        loop.create_server = functools.partial(create_server, ssl_handshake_timeout=self.handshake_timeout)
        try:
            await super().startup(sockets=sockets)
        finally:
            del loop.create_server

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
    """How the server meets its clients: an API key (None: none needed; never in a repr), at most
    ``max_connections`` open sockets (None: no cap), ``read_timeout`` seconds in all for each request's
    head and for its body, ``keep_alive_timeout`` seconds for an idle connection between requests, and
    TLS with ``ssl_context`` (:func:`~.tls.server_context`; None: plain HTTP)."""

    api_key: str | None = field(default=None, repr=False)
    max_connections: int | None = MAX_CONNECTIONS
    read_timeout: float | None = READ_TIMEOUT
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
    ssl_context: ssl.SSLContext | None = None


class _Config(uvicorn.Config):
    """uvicorn's settings, with the server's own TLS context (:mod:`.tls`) in place of the one uvicorn
    would make from files with its version's defaults."""

    def __init__(self, *args, ssl_context: ssl.SSLContext | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ssl_context = ssl_context

    def load(self) -> None:
        super().load()
        self.ssl = self._ssl_context


def _show_access_log(log_level: str) -> None:
    """At --log-level info or debug, the access log (:mod:`.access`) on stderr, as uvicorn's lines look."""
    logger = logging.getLogger("elmo_fast.serve.access")
    if logging.getLevelName(log_level.upper()) <= logging.INFO and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


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
        request_limits: RequestLimits,
        log_level: str = "warning",
        exposure: Exposure = Exposure(),
    ) -> None:
        self.sock = sock
        host, port = sock.getsockname()[:2]
        scheme = "https" if exposure.ssl_context is not None else "http"
        self.url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}"
        self.limits = limits
        served = compose(
            load,
            name,
            dim_of,
            limits,
            request_limits,
            self._failed,
            self._ready,
            api_key=exposure.api_key,
            read_timeout=exposure.read_timeout,
        )
        self.metrics, self.info, self.batcher = served.metrics, served.info, served.batcher
        self.exposure = exposure
        http = guarded_protocol(exposure.max_connections, exposure.read_timeout, served.metrics.error)
        config = _Config(
            served.app,
            log_level=log_level,
            access_log=False,  # the app's own (elmo_fast.serve.access), which carries the request id
            lifespan="on",
            http=http,
            timeout_graceful_shutdown=None,
            timeout_keep_alive=exposure.keep_alive_timeout,
            ssl_context=exposure.ssl_context,
        )
        _show_access_log(log_level)
        self.server = _Server(config)
        self.server.handshake_timeout = exposure.read_timeout
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
    request_limits: RequestLimits,
    host: str,
    port: int,
    log_level: str = "warning",
    announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    exposure: Exposure = Exposure(),
) -> tuple[signal.Signals | None, bool]:
    """Listen on host:port (before the model loads: a port in use fails at once), serve until a stop
    signal (see :class:`EmbeddingServer.run`)."""
    sock = listen(host, port)
    server = EmbeddingServer(sock, load, name, dim_of, limits, request_limits, log_level, exposure)
    server.announce = announce
    announce(f"elmo-fast serve: listening on {server.url}; loading the model")
    return server.run()
