"""Tests of the official models (elmo_fast.pretrained.official) against a local HTTP server (never the
internet)."""

from __future__ import annotations

import functools
import http.server
import os
import socket
import threading
from pathlib import Path

import pytest

from elmo_fast.errors import DownloadError, ElmoFastError
from elmo_fast.pretrained import http_download
from elmo_fast.pretrained import official as hub

TIMEOUT = 3


class _Server:
    def __init__(self, httpd: http.server.ThreadingHTTPServer) -> None:
        self.httpd = httpd
        self.requests: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    def _count(self) -> None:
        with self.server.state.lock:
            self.server.state.requests.append(self.path)

    def do_GET(self):
        self._count()
        super().do_GET()

    def do_HEAD(self):
        self._count()
        super().do_HEAD()


class _TruncatingHandler(_CountingHandler):
    """Announces a Content-Length, sends fewer bytes, then closes the connection."""

    def do_GET(self):
        self._count()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        self.wfile.write(os.urandom(1000))
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def serve(request):
    """serve(root, handler=_CountingHandler) -> _Server, shut down when the test ends."""
    servers = []

    def start(root: Path, handler=_CountingHandler) -> _Server:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
        httpd.daemon_threads = True
        state = _Server(httpd)
        httpd.state = state
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
        thread.daemon = True
        thread.start()
        servers.append((httpd, thread))
        return state

    def stop():
        for httpd, thread in servers:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=5)

    request.addfinalizer(stop)
    return start


def _write_model_files(root: Path, name: str, sizes=(300, 5000)) -> tuple[bytes, bytes]:
    contents = []
    for rel, size in zip(hub.MODELS[name], sizes):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        contents.append(data)
    return contents[0], contents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ELMO_FAST_CACHE", str(cache))
    return cache


@pytest.fixture
def remote(tmp_path) -> Path:
    root = tmp_path / "remote"
    root.mkdir()
    return root


def _files_under(path: Path) -> list[Path]:
    """The files under ``path``, the fetch locks (``locks/``) aside."""
    if not path.exists():
        return []
    return sorted(p for p in path.rglob("*") if p.is_file() and p.relative_to(path).parts[0] != "locks")


def test_models_table():
    assert hub.model_names() == ["small", "medium", "original", "original-5.5b", "pt", "pubmed"]
    assert set(hub.MODEL_DESCRIPTIONS) == set(hub.MODELS)
    assert hub.DEFAULT_BASE_URL == "https://allennlp.s3.amazonaws.com/models/elmo"
    for options, weights in hub.MODELS.values():
        assert not options.startswith(("/", "http")) and options.endswith("_options.json")
        assert not weights.startswith(("/", "http")) and "_weights" in weights and weights.endswith(".hdf5")
    assert hub.MODELS["original-5.5b"] == (
        "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_options.json",
        "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_weights.hdf5",
    )


def test_urls_of_the_official_files_name_their_model():
    """The addresses allennlp, flair and their users wrote (old and new S3 hosts, http or https) map to
    the model and the file's role; anything else is not an official model's file."""
    old = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
    new = "https://allennlp.s3.amazonaws.com/models/elmo/"
    for name, (options, weights) in hub.MODELS.items():
        for base in (old, new, new.replace("https:", "http:")):
            assert hub.model_for_url(base + options) == (name, "options")
            assert hub.model_for_url(base + weights) == (name, "weights")
    assert hub.model_for_url(old + "contributed/pt/elmo_pt_weights.hdf5") == ("pt", "weights")
    assert hub.model_for_url(new + "nothing/options.json") is None
    assert hub.model_for_url("https://example.org/models/elmo/" + hub.MODELS["small"][0]) is None
    assert hub.model_for_url("/local/" + hub.MODELS["small"][0]) is None
    assert hub.cached_files("small", "/c") == (Path("/c/small/options.json"), Path("/c/small/weights.hdf5"))


def test_urls_and_cache_dir_follow_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ELMO_FAST_BASE_URL", raising=False)
    monkeypatch.delenv("ELMO_FAST_CACHE", raising=False)
    assert hub.model_urls("small") == (
        "https://allennlp.s3.amazonaws.com/models/elmo/2x1024_128_2048cnn_1xhighway/"
        "elmo_2x1024_128_2048cnn_1xhighway_options.json",
        "https://allennlp.s3.amazonaws.com/models/elmo/2x1024_128_2048cnn_1xhighway/"
        "elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5",
    )
    assert hub.cache_dir() == Path("~/.cache/elmo_fast").expanduser()
    monkeypatch.setenv("ELMO_FAST_BASE_URL", "http://example.invalid/x/")
    monkeypatch.setenv("ELMO_FAST_CACHE", str(tmp_path))
    assert hub.model_urls("medium")[0].startswith("http://example.invalid/x/2x2048_256")
    assert hub.cache_dir() == tmp_path


def test_download_lands_at_right_paths(serve, remote, cache, monkeypatch):
    options_bytes, weights_bytes = _write_model_files(remote, "small")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    options, weights = hub.fetch_model("small", progress=False, timeout=TIMEOUT)

    assert options == cache / "small" / "options.json"
    assert weights == cache / "small" / "weights.hdf5"
    assert options.read_bytes() == options_bytes
    assert weights.read_bytes() == weights_bytes
    record = cache / "small" / "record.json"
    assert _files_under(cache) == [options, record, weights]  # no temp files left behind
    assert len(server.requests) == 2


def test_second_call_makes_no_request(serve, remote, cache, monkeypatch):
    _write_model_files(remote, "medium")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    first = hub.fetch_model("medium", progress=False, timeout=TIMEOUT)
    assert len(server.requests) == 2
    second = hub.fetch_model("medium", progress=False, timeout=TIMEOUT)
    assert second == first
    assert len(server.requests) == 2


def test_cache_argument_overrides_environment(serve, remote, cache, tmp_path, monkeypatch):
    _write_model_files(remote, "small")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)
    other = tmp_path / "other"

    options, weights = hub.fetch_model("small", cache=other, progress=False, timeout=TIMEOUT)
    assert options == other / "small" / "options.json" and options.is_file()
    assert weights == other / "small" / "weights.hdf5" and weights.is_file()
    assert (other / "small" / "record.json").is_file() and (other / "locks").is_dir()
    assert not cache.exists()


def test_only_missing_file_is_downloaded(serve, remote, cache, monkeypatch):
    _, weights_bytes = _write_model_files(remote, "small")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)
    (cache / "small").mkdir(parents=True)
    (cache / "small" / "options.json").write_bytes(b"local options")

    options, weights = hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    assert options.read_bytes() == b"local options"
    assert weights.read_bytes() == weights_bytes
    assert server.requests == ["/" + hub.MODELS["small"][1]]


def test_unknown_name_lists_valid_names(cache):
    with pytest.raises(ElmoFastError) as info:
        hub.fetch_model("huge", progress=False)
    message = str(info.value)
    assert "huge" in message
    for name in hub.model_names():
        assert name in message
    assert _files_under(cache) == []


def test_http_404_names_url_and_leaves_nothing(serve, remote, cache, monkeypatch):
    server = serve(remote)  # serves an empty directory
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    with pytest.raises(DownloadError) as info:
        hub.fetch_model("original", progress=False, timeout=TIMEOUT)
    message = str(info.value)
    assert hub.model_urls("original")[0] in message
    assert "404" in message
    assert "'original'" in message
    assert _files_under(cache) == []


def test_http_404_on_weights_keeps_no_partial_weights(serve, remote, cache, monkeypatch):
    _write_model_files(remote, "small")
    (remote / hub.MODELS["small"][1]).unlink()
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    with pytest.raises(DownloadError, match="404") as info:
        hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    assert hub.model_urls("small")[1] in str(info.value)
    # The complete options file may stay cached; nothing else may.
    assert _files_under(cache) == [cache / "small" / "options.json"]


def test_a_full_disk_is_a_download_error_naming_the_file_not_the_network(serve, remote, cache, monkeypatch):
    import errno

    from elmo_fast import durable

    _write_model_files(remote, "small")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)
    real = durable.file_writers._open

    class Full:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self._f, name)

    monkeypatch.setattr(durable.file_writers, "_open", lambda *a, **k: Full(real(*a, **k)))
    with pytest.raises(DownloadError) as info:
        hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    message = str(info.value)
    assert f"cannot write {cache / 'small' / 'options.json'}: No space left on device (ENOSPC)" in message
    assert "offline" not in message and "connection lost" not in message
    assert _files_under(cache) == []


def test_truncated_response_raises_and_cleans_up(serve, remote, cache, monkeypatch):
    server = serve(remote, handler=_TruncatingHandler)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    with pytest.raises(DownloadError) as info:
        hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    message = str(info.value)
    assert hub.model_urls("small")[0] in message
    assert "incomplete" in message
    assert "100000" in message
    assert not (cache / "small" / "options.json").exists()
    assert _files_under(cache) == []


def test_closed_port_gives_offline_message(cache, monkeypatch):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv("ELMO_FAST_BASE_URL", f"http://127.0.0.1:{port}/elmo")

    with pytest.raises(DownloadError) as info:
        hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    message = str(info.value)
    assert hub.model_urls("small")[0] in message
    assert "offline" in message
    assert "--options" in message and "--weights" in message
    assert str(cache / "small" / "options.json") in message
    assert _files_under(cache) == []


def test_unresponsive_server_times_out_with_offline_message(cache, monkeypatch):
    # A listening socket that never answers: connect succeeds, the response never comes.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        port = sock.getsockname()[1]
        monkeypatch.setenv("ELMO_FAST_BASE_URL", f"http://127.0.0.1:{port}")
        with pytest.raises(DownloadError, match="offline"):
            hub.fetch_model("small", progress=False, timeout=0.5)
    finally:
        sock.close()
    assert _files_under(cache) == []


def test_keyboard_interrupt_cleans_temp_file(serve, remote, cache, monkeypatch):
    _write_model_files(remote, "small", sizes=(300, 50_000))
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)
    monkeypatch.setattr(http_download, "_CHUNK_SIZE", 1000)

    real_tqdm = http_download.tqdm
    updates: list[int] = []

    class InterruptingBar(real_tqdm):
        def __init__(self, *args, **kwargs):
            self.is_weights = str(kwargs.get("desc", "")).endswith("weights.hdf5")
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if self.is_weights:
                updates.append(n)
                if len(updates) == 3:  # interrupt mid-file, after some bytes were written
                    raise KeyboardInterrupt
            return super().update(n)

    monkeypatch.setattr(http_download, "tqdm", InterruptingBar)
    with pytest.raises(KeyboardInterrupt):
        hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    assert len(updates) == 3
    assert _files_under(cache) == [cache / "small" / "options.json"]


def test_progress_bar_goes_to_stderr(serve, remote, cache, monkeypatch, capsys):
    _write_model_files(remote, "small")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    hub.fetch_model("small", progress=True, timeout=TIMEOUT)
    captured = capsys.readouterr()
    assert "weights.hdf5" in captured.err
    assert "100%" in captured.err
    assert captured.out == ""


def test_no_progress_bar_when_disabled(serve, remote, cache, monkeypatch, capsys):
    _write_model_files(remote, "small")
    server = serve(remote)
    monkeypatch.setenv("ELMO_FAST_BASE_URL", server.url)

    hub.fetch_model("small", progress=False, timeout=TIMEOUT)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
