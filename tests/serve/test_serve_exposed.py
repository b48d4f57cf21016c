"""`elmo-fast serve` safe to put on a network: an API key on every route but the open ones, a cap on open
sockets, total deadlines for each request's head and body, idle keep-alive, modern TLS only, nothing
internal in an answer, no secret in a repr, a log line or the metrics. Real servers on free loopback ports
(tests/support/serve_process.py; slow clients by the hundred: tests/support/slow_clients.py); the guards'
rules in-process."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import time

import cli_process
import pytest
from serve_process import ServerProcess, http_request

from elmo_fast.serve import guards

KEY = "s3cret-Key_for-tests"
EMBED = {"sentences": [["a", "b"]], "output": "mean"}


@pytest.fixture(scope="module")
def model_dir(random_models):
    options, _ = random_models("tiny", seed=7)
    return options.parent


def one_line_error(body: bytes, kind: str) -> str:
    assert body.count(b"\n") == 0, body
    error = json.loads(body)["error"]
    assert error["type"] == kind, error
    return error["message"]


# ---- the rules, in-process -------------------------------------------------------------------------


def test_bearer_matches_compares_in_constant_time(monkeypatch):
    calls = []
    real = guards.hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(guards.hmac, "compare_digest", spy)
    assert guards.bearer_matches(f"Bearer {KEY}", KEY) and guards.bearer_matches(f"bearer  {KEY} ".encode(), KEY)
    for wrong in (None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer ", "Bearer"):
        assert not guards.bearer_matches(wrong, KEY), wrong
    # every comparison is of two equal-length digests: its time tells nothing of the guess
    assert calls and all(a == b == 32 for a, b in calls)
    with pytest.raises(ValueError, match="empty API key"):
        guards.Guards(lambda *a: None, api_key="")


def test_the_open_routes_are_open_under_a_prefix_too():
    """A server that mounts the app under a prefix (a Ray Serve route_prefix) passes the whole path and
    the prefix as root_path: /health stays open there, and nothing else does."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def status(path: str, root_path: str = "") -> int:
        sent = []

        async def send(message):
            sent.append(message)

        await guards.Guards(app, api_key=KEY)(
            {"type": "http", "path": path, "root_path": root_path, "headers": []}, None, send
        )
        return sent[0]["status"]

    assert asyncio.run(status("/health")) == 200 and asyncio.run(status("/elmo/health", "/elmo")) == 200
    for path, root in (
        ("/embed", ""),
        ("/elmo/embed", "/elmo"),
        ("/elmo/health", ""),
        ("/elmohealth", "/elmo"),
        ("/elmo/health/x", "/elmo"),
    ):
        assert asyncio.run(status(path, root)) == 401, (path, root)
    assert guards.route_path({"path": "/elmo", "root_path": "/elmo"}) == "/"


def test_a_body_that_stalls_is_answered_408_and_the_app_sees_a_disconnect():
    seen = []

    async def app(scope, receive, send):
        seen.append(await receive())
        seen.append(await receive())

    async def main():
        sent = []
        queue: asyncio.Queue = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b"{", "more_body": True})
        guarded = guards.Guards(app, read_timeout=0.05, refused=lambda kind: sent.append(kind))

        async def send(message):
            sent.append(message)

        await guarded({"type": "http", "path": "/embed", "headers": []}, queue.get, send)
        return sent, guarded.active

    sent, active = asyncio.run(main())
    assert seen == [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]
    assert sent[0] == "read_timeout" and sent[1]["status"] == 408 and (b"connection", b"close") in sent[1]["headers"]
    one_line_error(sent[2]["body"], "read_timeout")
    assert active == 0


def test_the_body_deadline_is_a_total_not_a_bound_on_each_piece():
    """A body trickled a piece at a time, each well within the read timeout, is cut off when the whole
    has taken longer than it (a bound on each piece let a client hold its slot for weeks)."""
    pieces = []

    async def app(scope, receive, send):
        while (message := await receive())["type"] == "http.request":
            pieces.append(message["body"])
            if not message["more_body"]:
                break

    async def main():
        sent = []

        async def receive():
            await asyncio.sleep(0.1)  # a piece every 0.1 s: each well within the 0.35 s deadline
            return {"type": "http.request", "body": b" ", "more_body": len(pieces) < 15}  # 1.5 s in all

        async def send(message):
            sent.append(message)

        loop = asyncio.get_running_loop()
        start = loop.time()
        await guards.Guards(app, read_timeout=0.35)({"type": "http", "path": "/embed", "headers": []}, receive, send)
        return sent, loop.time() - start

    sent, took = asyncio.run(main())
    assert sent and sent[0]["status"] == 408 and 0.3 < took < 1.0, (sent, took)
    assert len(pieces) <= 4


# ---- a real server ----------------------------------------------------------------------------------


def stalled_request(server, path="/embed", key=KEY) -> socket.socket:
    """A connection that sends a request's head and the start of its body, then nothing."""
    s = socket.create_connection((server.host, server.port), timeout=30)
    s.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f'Content-Length: 100\r\n\r\n{{"sent'
        ).encode()
    )
    return s


def read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """What the server sent until it closed the connection, and how long that took."""
    s.settimeout(timeout)
    start, data = time.monotonic(), b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data, time.monotonic() - start
        data += chunk


@pytest.fixture(scope="module")
def guarded(model_dir):
    import os

    os.environ["ELMO_FAST_API_KEY"] = KEY  # (the key from the environment: not in the process list)
    try:
        server = ServerProcess(model_dir, "--max-connections", 4, "--read-timeout", 2, "--log-level", "info")
    finally:
        del os.environ["ELMO_FAST_API_KEY"]
    yield server
    assert server.stop() == 0
    assert KEY not in "".join(server.lines)  # never logged


@pytest.mark.slow
def test_an_api_key_is_needed_on_every_route_but_the_open_ones(guarded):
    for path in ("/health", "/openapi.json", "/docs"):
        status, _, body = guarded.request("GET", path)
        assert status == 200, (path, body)
    for method, path, body in (
        ("POST", "/embed", EMBED),
        ("POST", "/v1/embeddings", {"input": "a b"}),
        ("POST", "/tokenize", {"texts": ["a b"]}),
        ("GET", "/info", None),
        ("GET", "/metrics", None),
        ("GET", "/nowhere", None),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"X-Api-Key": KEY}):
            status, head, data = guarded.request(method, path, body, headers)
            assert status == 401 and head["www-authenticate"] == "Bearer", (path, headers, status)
            assert "Authorization: Bearer KEY" in one_line_error(data, "unauthorized")
            assert KEY not in data.decode()
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _, data = guarded.post("/embed", EMBED, auth)
    assert status == 200 and len(json.loads(data)["embeddings"][0]) == 32
    status, _, data = guarded.request("GET", "/metrics", headers=auth)
    assert status == 200 and KEY not in data.decode()
    assert guarded.request("POST", "/v1/embeddings", {"input": "a b"}, auth)[0] == 200


@pytest.mark.slow
def test_sockets_past_the_cap_are_refused_at_once_and_stalled_bodies_get_408(guarded):
    """--max-connections 4 open sockets: a fifth is answered 503 and closed at once, not queued; the four
    (each stalled halfway through its body) get 408 within the read timeout, and the cap frees."""
    auth = {"Authorization": f"Bearer {KEY}"}
    held = [stalled_request(guarded) for _ in range(4)]
    time.sleep(0.3)
    extra = socket.create_connection((guarded.host, guarded.port), timeout=30)
    try:
        data, took = read_until_closed(extra, 10)
        assert data.startswith(b"HTTP/1.1 503 ") and took < 1.0, (data, took)
        assert "--max-connections" in one_line_error(data.split(b"\r\n\r\n", 1)[1], "too_many_connections")
    except ConnectionResetError:  # closed before its answer could be read: refused all the same
        pass
    extra.close()
    for s in held:
        data, took = read_until_closed(s, 30)
        assert data.startswith(b"HTTP/1.1 408 "), data
        one_line_error(data.split(b"\r\n\r\n", 1)[1], "read_timeout")
        assert took < 2 + 2, took
        s.close()
    status, _, data = guarded.post("/embed", EMBED, auth)
    assert status == 200, data  # the sockets are free again
    metrics = guarded.request("GET", "/metrics", headers=auth)[2].decode()
    assert 'elmo_fast_errors_total{kind="too_many_connections"}' in metrics


@pytest.mark.slow
def test_a_connection_that_sends_no_whole_request_head_is_closed(guarded):
    silent = socket.create_connection((guarded.host, guarded.port), timeout=30)
    half = socket.create_connection((guarded.host, guarded.port), timeout=30)
    half.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Le")
    for s in (silent, half):
        data, took = read_until_closed(s, 30)
        assert data == b"" and took < 2 + 2, (data, took)
        s.close()
    assert guarded.request("GET", "/health")[0] == 200


def test_bytes_that_are_not_http_get_one_line_of_json(guarded):
    s = socket.create_connection((guarded.host, guarded.port), timeout=30)
    try:
        s.sendall(b"HELLO THERE\x00\x01 not http\r\n\r\n")
        data, _ = read_until_closed(s, 30)
    finally:
        s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head, head
    assert "not valid HTTP" in one_line_error(body, "malformed_request")
    assert json.loads(body)["error"]["request_id"].encode() in head


def _one_exchange(s: socket.socket, request: bytes) -> bytes:
    s.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    while len(body) < length:
        body += s.recv(65536)
    return head


@pytest.mark.slow
def test_each_request_on_a_keep_alive_connection_has_its_own_head_deadline(guarded):
    """A client that sends one good request, then trickles the next one's head a byte at a time (each
    byte well within the read timeout), is closed once that head has taken the read timeout in all."""
    s = socket.create_connection((guarded.host, guarded.port), timeout=30)
    try:
        for _ in range(2):  # two good requests on one connection: keep-alive works
            head = _one_exchange(s, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and b"x-request-id" in head.lower(), head
        start, closed = time.monotonic(), False
        for byte in b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n":
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            s.settimeout(0.5)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
        took = time.monotonic() - start
        assert closed and took < 2 + 2, took
    finally:
        s.close()


@pytest.mark.slow
def test_an_idle_keep_alive_connection_is_closed(model_dir):
    server = ServerProcess(model_dir, "--keep-alive-timeout", 1, "--read-timeout", 20)
    try:
        s = socket.create_connection((server.host, server.port), timeout=30)
        assert _one_exchange(s, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200 ")
        data, took = read_until_closed(s, 30)
        assert data == b"" and 0.5 < took < 1 + 2, took
        s.close()
    finally:
        assert server.stop() == 0


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@pytest.mark.slow
def test_hundreds_of_slow_clients_of_each_kind_are_cut_off_while_a_good_client_is_served(model_dir):
    """600 clients that connect and send nothing, 600 that trickle a body a byte a second, 600 that send a
    good request and then stall the next one's head (tests/support/slow_clients.py, one asyncio process):
    every one is disconnected within --read-timeout + 2 s, while a well-behaved client beside them gets
    200s throughout, none waiting half the read timeout, its 99th percentile latency within twice an idle
    server's plus 100 ms. The attacking process runs
    at the lowest priority, so what the good client sees is the server's cost of holding the slow ones."""
    import resource
    import sys

    from repo_paths import REPO

    n, read_timeout = 600, 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 3 * n + 512:
        pytest.skip(f"{3 * n} slow clients need {3 * n + 512} open files; this machine allows {hard} (ulimit -n)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server (a child) inherits it
    try:
        server = ServerProcess(model_dir, "--read-timeout", read_timeout, "--max-connections", 4 * n, "--api-key", KEY)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    auth = {"Authorization": f"Bearer {KEY}"}

    def good_request() -> float:
        start = time.perf_counter()
        status, _, body = server.post("/embed", {"sentences": [["a", "good", "client"]], "output": "mean"}, auth)
        assert status == 200, body
        return time.perf_counter() - start

    try:
        for _ in range(20):
            good_request()  # warm
        idle = [good_request() for _ in range(300)]
        attack = cli_process.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "support" / "slow_clients.py"),
                server.host,
                str(server.port),
                str(n),
                KEY,
            ],
            stdout=subprocess.PIPE,
            text=True,
            # the attackers' own CPU is not the server's: on a 2-core machine it would otherwise take the
            # cores from the server and the good client alike, measuring the test's clients, not the server
            preexec_fn=lambda: os.nice(19),
        )
        busy = []
        while attack.poll() is None:
            busy.append(good_request())
        report = json.loads(attack.stdout.read().splitlines()[-1])
        assert attack.returncode == 0
        # the idle server measured again, after: on a shared machine its own noise moves from minute to minute
        idle_after = [good_request() for _ in range(300)]
    finally:
        assert server.stop() == 0
    for kind, seen in report.items():
        assert seen["closed"] == n and not seen["errors"], (kind, seen)
        assert seen["longest"] < read_timeout + 2, (kind, seen)
    assert len(busy) >= 100, len(busy)
    baseline = max(_p99(idle), _p99(idle_after))
    # A server that let a slow client hold its loop or a worker would keep the good client waiting for up to
    # the read timeout (2 s) a slow client is held: the bounds sit far below that and above a shared 2-core
    # host's own noise (a CI run saw 49 ms against an idle 17 ms; the server's latency is measured by
    # benchmarks/bench_serve.py, not asserted here)
    worst = max(busy)
    assert worst < read_timeout / 2, f"a good request waited {worst * 1e3:.0f} ms under attack"
    assert _p99(busy) <= 2 * baseline + 0.1, f"p99 {_p99(busy) * 1e3:.1f} ms under attack, {baseline * 1e3:.1f} idle"


# ---- TLS ----------------------------------------------------------------------------------------------


def self_signed(tmp_path, password: str | None = None) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (encrypted with ``password`` if given), made here (the
    `cryptography` package, else `openssl`)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip(
                "making a test certificate needs the `cryptography` package (pip install cryptography) or "
                "the `openssl` command (apt-get install openssl)"
            )
        protect = ["-passout", f"pass:{password}"] if password else ["-nodes"]
        cli_process.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", *protect]
            + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"]
            + ["-addext", "subjectAltName=IP:127.0.0.1"],
            check=True,
            capture_output=True,
        )
        return str(cert), str(key)
    import ipaddress

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    encryption = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return str(cert), str(key)


#: a client that offers only TLS 1.1 (OpenSSL 3 refuses to offer it at its default security level, so this
#: client lowers its own @SECLEVEL to 0: the refusal tested is the server's)
OLD_TLS = ("TLSv1_1", "DEFAULT:@SECLEVEL=0")
#: a TLS 1.2 client that offers only CBC suites (with ECDHE: only the cipher mode is wrong)
CBC_ONLY = ("TLSv1_2", "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:ECDHE-ECDSA-AES128-SHA256:@SECLEVEL=0")


def client_context(cert: str, version: str, ciphers: str | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cert)
    if ciphers:
        context.set_ciphers(ciphers)
    context.minimum_version = context.maximum_version = getattr(ssl.TLSVersion, version)
    return context


def handshake(context: ssl.SSLContext, host: str, port: int) -> str:
    """The TLS version agreed with host:port (an ssl.SSLError or OSError: refused)."""
    with socket.create_connection((host, port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            return tls.version()


def permissive_server(cert: str, key: str, password: str | None):
    """A TLS server that takes anything (TLS 1.0 up, any suite): the control that shows each refused
    client does offer what it says. Answers handshakes until its socket closes."""
    import threading

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("ALL:@SECLEVEL=0")
    context.load_cert_chain(cert, key, password=password)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    threading.Thread(target=serve, daemon=True).start()
    return listener


@pytest.mark.slow
def test_tls_is_1_2_or_later_with_aead_suites_only(model_dir, tmp_path, monkeypatch):
    """The server's own TLS context, its key encrypted (the password from the environment): TLS 1.3 and
    TLS 1.2 with ECDHE + AES-GCM succeed; a TLS 1.1 client and a TLS 1.2 client offering only CBC suites
    are refused (while a permissive server accepts both: they do offer what they say)."""
    import http.client

    password = "pem-pass phrase"
    cert, key = self_signed(tmp_path, password)
    monkeypatch.setenv("ELMO_FAST_SSL_KEYFILE_PASSWORD", password)
    server = ServerProcess(model_dir, "--ssl-certfile", cert, "--ssl-keyfile", key)
    control = permissive_server(cert, key, password)
    try:
        assert any("ready on https://" in line for line in server.lines)
        assert handshake(client_context(cert, "TLSv1_3"), server.host, server.port) == "TLSv1.3"
        assert handshake(client_context(cert, "TLSv1_2"), server.host, server.port) == "TLSv1.2"
        for version, ciphers in (OLD_TLS, CBC_ONLY):
            agreed = handshake(client_context(cert, version, ciphers), *control.getsockname()[:2])
            assert agreed == version.replace("_", "."), agreed  # the client offers it
            with pytest.raises((ssl.SSLError, ConnectionError)):
                handshake(client_context(cert, version, ciphers), server.host, server.port)
        conn = http.client.HTTPSConnection(
            server.host, server.port, context=client_context(cert, "TLSv1_3"), timeout=60
        )
        conn.request("POST", "/embed", body=json.dumps(EMBED), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and len(json.loads(r.read())["embeddings"][0]) == 32
        conn.close()
        with pytest.raises(ssl.SSLError):  # a client that does not trust the certificate is refused
            strict = http.client.HTTPSConnection(
                server.host, server.port, context=ssl.create_default_context(), timeout=30
            )
            strict.request("GET", "/health")
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):  # plain HTTP gets no answer
            status, _, _ = http_request(server.host, server.port, "GET", "/health", timeout=10)
            assert status != 200
    finally:
        control.close()
        assert server.stop() == 0
    assert password not in "".join(server.lines)


@pytest.mark.slow
def test_a_silent_client_cannot_hold_a_tls_handshake_open(model_dir, tmp_path):
    cert, key = self_signed(tmp_path)
    server = ServerProcess(model_dir, "--ssl-certfile", cert, "--ssl-keyfile", key, "--read-timeout", 2)
    try:
        silent = socket.create_connection((server.host, server.port), timeout=30)
        data, took = read_until_closed(silent, 30)
        assert took < 2 + 2, took
        silent.close()
    finally:
        assert server.stop() == 0


def test_bad_exposure_flags_are_one_line_errors_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from elmo_fast.cli import main

    (tmp_path / "not-a-cert.pem").write_text("hello")
    cert, key = self_signed(tmp_path, "right")
    secret = tmp_path / "key.txt"
    secret.write_text(KEY + "\n")
    secret.chmod(0o644)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    empty.chmod(0o600)
    cases = [
        (["--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-keyfile-password", "wrong"], "does not open it"),
        (["--ssl-certfile", cert, "--ssl-keyfile", key], "does not open it"),
        (["--ssl-keyfile-password", "x"], "--ssl-keyfile-password needs --ssl-certfile"),
        (["--api-key-file", str(secret)], "readable by others than its owner (mode 0644); chmod 600"),
        (["--api-key-file", str(empty)], "its first line is empty"),
        (["--api-key-file", str(tmp_path / "nope")], "nope: file not found"),
        (["--api-key-file", str(empty), "--api-key", "k"], "not both"),
        (["--keep-alive-timeout", "0"], "--keep-alive-timeout must be > 0"),
        (["--max-client-batch-size", "0"], "--max-client-batch-size must be >= 1"),
        (["--payload-limit", "10"], "--payload-limit must be >= 1024"),
        (["--ssl-keyfile", str(tmp_path / "k.pem")], "--ssl-keyfile needs --ssl-certfile"),
        (["--ssl-certfile", str(tmp_path / "missing.pem")], "missing.pem: file not found"),
        (["--ssl-certfile", str(tmp_path / "not-a-cert.pem")], "not a certificate and key that go together"),
        (["--api-key", " "], "--api-key (or ELMO_FAST_API_KEY) is empty"),
        (["--max-connections", "-1"], "--max-connections must be >= 1"),
        (["--read-timeout", "0"], "--read-timeout must be > 0"),
    ]
    for flags, message in cases:
        assert main(["serve", "--port", "0", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
