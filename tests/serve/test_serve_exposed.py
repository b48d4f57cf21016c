"""`elmo-fast serve` safe to put on a network: an API key on every route but /health, a bound on the
connections with a request in progress, a read deadline for a request's head and body, and TLS.
Real servers on free loopback ports (tests/support/serve_process.py); the guards' rules in-process."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import time

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
        server = ServerProcess(model_dir, "--max-connections", 2, "--read-timeout", 2)
    finally:
        del os.environ["ELMO_FAST_API_KEY"]
    yield server
    assert server.stop() == 0
    assert KEY not in "".join(server.lines)  # never logged


@pytest.mark.slow
def test_an_api_key_is_needed_on_every_route_but_health(guarded):
    status, _, body = guarded.request("GET", "/health")
    assert status == 200, body
    for method, path, body in (
        ("POST", "/embed", EMBED),
        ("POST", "/v1/embeddings", {"input": "a b"}),
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
    assert guarded.request("GET", "/metrics", headers=auth)[0] == 200
    assert guarded.request("POST", "/v1/embeddings", {"input": "a b"}, auth)[0] == 200


@pytest.mark.slow
def test_connections_beyond_the_bound_get_503_and_stalled_bodies_408(guarded):
    auth = {"Authorization": f"Bearer {KEY}"}
    held = [stalled_request(guarded) for _ in range(2)]  # the two slots of --max-connections 2
    time.sleep(0.3)
    status, head, data = guarded.post("/embed", EMBED, auth)
    assert status == 503 and head["retry-after"] == "1", (status, data)
    assert "--max-connections" in one_line_error(data, "too_many_connections")
    for s in held:  # each stalled client is answered 408 and dropped after the read timeout, not held
        data, took = read_until_closed(s, 30)
        assert data.startswith(b"HTTP/1.1 408 "), data
        one_line_error(data.split(b"\r\n\r\n", 1)[1], "read_timeout")
        assert took < 10, took
        s.close()
    status, _, data = guarded.post("/embed", EMBED, auth)
    assert status == 200, data  # the slots are free again


@pytest.mark.slow
def test_a_connection_that_sends_no_whole_request_head_is_closed(guarded):
    silent = socket.create_connection((guarded.host, guarded.port), timeout=30)
    half = socket.create_connection((guarded.host, guarded.port), timeout=30)
    half.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Le")
    for s in (silent, half):
        data, took = read_until_closed(s, 30)
        assert data == b"" and took < 10, (data, took)
        s.close()
    assert guarded.request("GET", "/health")[0] == 200


@pytest.mark.slow
def test_many_stalled_clients_hold_nothing_past_the_read_timeout(guarded):
    """Hundreds of clients that send their headers and stall (3,000 used to stay open for ever)."""
    import resource

    n = min(600, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2 - 64)
    clients = [stalled_request(guarded) for _ in range(n)]
    deadline = time.monotonic() + 60
    for s in clients:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            while s.recv(65536):
                pass
        except TimeoutError:
            raise AssertionError("a stalled client was still connected 60 s after its read timeout of 2 s") from None
        s.close()
    assert guarded.request("GET", "/health")[0] == 200


# ---- TLS ----------------------------------------------------------------------------------------------


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, made here (the `cryptography` package, else `openssl`)."""
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
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "2",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],
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
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert), str(key)


@pytest.mark.slow
def test_tls_with_a_certificate_and_its_key(model_dir, tmp_path):
    import http.client

    cert, key = self_signed(tmp_path)
    server = ServerProcess(model_dir, "--ssl-certfile", cert, "--ssl-keyfile", key)
    try:
        assert any("ready on https://" in line for line in server.lines)
        context = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection(server.host, server.port, context=context, timeout=60)
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
        assert server.stop() == 0


def test_bad_exposure_flags_are_one_line_errors_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from elmo_fast.cli import main

    (tmp_path / "not-a-cert.pem").write_text("hello")
    cases = [
        (["--ssl-keyfile", str(tmp_path / "k.pem")], "--ssl-keyfile needs --ssl-certfile"),
        (["--ssl-certfile", str(tmp_path / "missing.pem")], "missing.pem: file not found"),
        (["--ssl-certfile", str(tmp_path / "not-a-cert.pem")], "not a certificate and key that go together"),
        (["--api-key", " "], "--api-key (or ELMO_FAST_API_KEY) is empty"),
        (["--max-connections", "0"], "--max-connections must be >= 1"),
        (["--read-timeout", "0"], "--read-timeout must be > 0"),
    ]
    for flags, message in cases:
        assert main(["serve", "--port", "0", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
