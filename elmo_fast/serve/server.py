"""Running the app on uvicorn: the listening socket bound first (a port in use is a one-line error
before any model loads), and a graceful stop on SIGTERM, SIGINT and SIGHUP: stop accepting, answer
every request already received (its sentences are queued, and the model thread finishes the
queue), close the socket, and return normally so that the command exits 0."""
from __future__ import annotations

import signal
import socket
import sys
import threading
from typing import Callable

import uvicorn

from ..errors import ElmoFastError
from .app import ModelInfo, create_app
from .batcher import Batcher, Limits
from .metrics import Metrics

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
        raise ElmoFastError(f"cannot listen on {host}:{port}: {e.strerror} (another server there? pick another "
                            f"--port)") from None
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


class EmbeddingServer:
    """The app, its batcher and uvicorn on a listening socket. ``load()`` (run on the model thread)
    returns the embedder; ``dim_of(embedder)`` is the size of its vectors; ``name`` what answers
    call the model. :meth:`run` serves until :meth:`stop` or a stop signal (main thread only)."""

    def __init__(self, sock: socket.socket, load: Callable[[], object], name: str, dim_of: Callable[[object], int],
                 limits: Limits, max_request_tokens: int, log_level: str = "warning") -> None:
        self.sock = sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        self.limits = limits
        self.metrics = Metrics()
        self.info = info = ModelInfo(name)

        def load_and_measure():
            embedder = load()
            info.dim = dim_of(embedder)
            return embedder

        self.batcher = batcher = Batcher(load_and_measure, limits, self.metrics)
        self.metrics.gauges.update({
            "queue_depth": ("Requests waiting for a batch.", batcher.queue_depth),
            "queued_sentences": ("Sentences waiting for a batch.", batcher.queued_sentences),
            "ready": ("1 once the model is loaded and warm.", lambda: float(batcher.ready.is_set())),
            "model_busy": ("1 while the model thread runs a batch.", lambda: float(batcher.busy)),
        })
        app = create_app(batcher, self.metrics, info, max_request_tokens, self._failed, self._ready)
        config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on",
                                timeout_graceful_shutdown=None, timeout_keep_alive=30)
        self.server = _Server(config)
        self.announce: Callable[[str], None] = lambda line: None

    def _failed(self, error: BaseException) -> None:
        self.server.should_exit = True

    def _ready(self) -> None:
        i, lim = self.info, self.limits
        self.announce(f"elmo-fast serve: ready on {self.url}: model {i.name!r} ({i.dim} dims); max batch "
                      f"{lim.max_batch_size} sentences / {lim.max_batch_tokens} padded tokens, wait "
                      f"{lim.max_wait_ms:g} ms")

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


def run_server(load: Callable[[], object], name: str, dim_of: Callable[[object], int], limits: Limits,
               max_request_tokens: int, host: str, port: int, log_level: str = "warning",
               announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
               ) -> tuple[signal.Signals | None, bool]:
    """Listen on host:port (before the model loads: a port in use fails at once), serve until a stop
    signal (see :class:`EmbeddingServer.run`)."""
    sock = listen(host, port)
    server = EmbeddingServer(sock, load, name, dim_of, limits, max_request_tokens, log_level)
    server.announce = announce
    announce(f"elmo-fast serve: listening on {server.url}; loading the model")
    return server.run()
