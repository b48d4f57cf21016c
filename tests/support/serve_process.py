"""`elmo-fast serve` in a subprocess (on a free loopback port, ready when it says so) and a plain HTTP client."""

from __future__ import annotations

import http.client
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import cli_process

START_TIMEOUT = 240  # a loaded 2-core CI machine takes seconds to import torch


class ServerProcess:
    def __init__(self, model_dir, *flags) -> None:
        """model_dir: the model to serve, or None for one the flags name (``--onnx FILE``)."""
        model = [] if model_dir is None else ["--model-dir", str(model_dir)]
        cmd = [sys.executable, "-m", "elmo_fast", "serve", *model, "--port", "0", *map(str, flags)]
        self.proc = cli_process.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._new = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        line = self.wait_for("ready on ", START_TIMEOUT)
        m = re.search(r"https?://([\d.]+):(\d+)", line)
        self.host, self.port = m.group(1), int(m.group(2))

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} from the server in {timeout} s: {''.join(self.lines)}") from None
            if line is None:
                raise AssertionError(f"the server exited ({self.proc.wait()}): {''.join(self.lines)}")
            if text in line:
                return line

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 120):
        return http_request(self.host, self.port, method, path, body, headers, timeout)

    def post(self, path: str, body, headers=None):
        status, head, data = self.request("POST", path, body, headers)
        return status, head, data

    def metric(self, name: str) -> float:
        text = self.request("GET", "/metrics")[2].decode()
        m = re.search(rf"^elmo_fast_{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self, sig=signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def http_request(host: str, port: int, method: str, path: str, body=None, headers=None, timeout: float = 120):
    """(status, headers, body bytes); a dict body is sent as JSON."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()
