"""A static file server on 127.0.0.1 that counts its requests, for download tests (never the internet).

``with FileServer(root, delay=0.0) as server:`` serves ``root`` at ``server.url``; ``server.gets()`` lists
the paths GET asked for, in order (shared between threads; the test reads it after the clients end);
``delay`` seconds pass before each answer (slow downloads, to make two clients overlap).
"""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    def do_GET(self):
        state = self.server.state  # type: ignore[attr-defined]
        with state.lock:
            state.requests.append(self.path)
        time.sleep(state.delay)
        super().do_GET()


class FileServer:
    def __init__(self, root: Path, delay: float = 0.0) -> None:
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.delay = delay
        self._httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_Handler, directory=str(root))
        )
        self._httpd.daemon_threads = True
        self._httpd.state = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def gets(self) -> list[str]:
        with self.lock:
            return list(self.requests)

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
