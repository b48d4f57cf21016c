"""`elmo-fast serve`: the endpoints on a real server (a subprocess on a free loopback port, a tiny
random model), compared with ElmoEmbedder sentence by sentence; bad input; a full queue; a client
that hangs up; SIGTERM with requests in flight. The batcher's choices are tested in-process."""

from __future__ import annotations

import base64
import io
import json
import re
import signal
import socket
import sys
import threading
import time

import cli_process
import numpy as np
import pytest
from repo_paths import REPO
from serve_cases import BAD, OPENAI_BAD, TOL, concurrent_clients, expected, random_sentences
from serve_process import ServerProcess, http_request

from elmo_fast import ElmoEmbedder
from elmo_fast.serve.batcher import Batcher, Limits, select_batch
from elmo_fast.serve.metrics import Metrics
from elmo_fast.serve.protocol import RequestLimits
from elmo_fast.tokenizer import tokenize

# ---------------------------------------------------------------------------------------------
# a server in a subprocess, and a plain HTTP client


def wait_until(condition, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = ServerProcess(tiny_dir, "--max-request-tokens", 300, "--max-wait-ms", 20)
    yield s
    assert s.stop() == 0


# ---------------------------------------------------------------------------------------------
# the endpoints


@pytest.mark.slow
def test_health_and_metrics(server):
    status, head, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok", "model": server_model_name(server), "dim": 32}
    status, head, body = server.request("GET", "/metrics")
    text = body.decode()
    assert status == 200 and head["content-type"].startswith("text/plain")
    for name in (
        "requests_total",
        "errors_total",
        "batch_size_bucket",
        "batch_padded_tokens_bucket",
        "request_latency_seconds",
        "queue_depth",
        "ready 1",
        "model_busy 0",
    ):
        assert f"elmo_fast_{name}" in text, name


def server_model_name(server) -> str:
    return re.search(r"model '([^']+)'", "".join(server.lines)).group(1)


@pytest.mark.parametrize("output", ["all", "average", "sum", "top", "mean"])
def test_embed_equals_the_embedder_sentence_by_sentence(server, embedder, output):
    rng = np.random.default_rng(1)
    sentences = random_sentences(rng, [7, 1, 19, 2, 33, 5])  # one batch, mixed lengths
    status, head, body = server.post("/embed", {"sentences": sentences, "output": output})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["dim"] == 32 and answer["model"] == server_model_name(server)
    assert len(answer["embeddings"]) == len(sentences)
    for s, got in zip(sentences, answer["embeddings"]):
        want = expected(embedder, s, output)
        got = np.array(got, dtype=np.float32)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= TOL


def test_embed_is_all_layers_by_default(server, embedder):
    s = ["The", "default", "output"]
    answer = json.loads(server.post("/embed", {"sentences": [s]})[2])
    assert np.array(answer["embeddings"][0]).shape == (3, 3, 32)


def test_texts_are_tokenized_as_embed_tokenize(server, embedder):
    texts = ["I don't think John's car costs $1,000.", "  Hello,\tworld!  "]
    answer = json.loads(server.post("/embed", {"texts": texts, "output": "average"})[2])
    for t, got in zip(texts, answer["embeddings"]):
        want = expected(embedder, tokenize(t), "average")
        assert np.array(got).shape == want.shape and np.abs(np.array(got) - want).max() <= TOL


@pytest.mark.parametrize("output", ["all", "top", "mean"])
def test_npy_answers(server, embedder, output):
    rng = np.random.default_rng(2)
    sentences = random_sentences(rng, [4, 11, 1])
    status, head, body = server.post(
        "/embed", {"sentences": sentences, "output": output}, {"Accept": "application/x-npy"}
    )
    assert status == 200 and head["content-type"] == "application/x-npy" and head["x-dim"] == "32"
    array = np.load(io.BytesIO(body), allow_pickle=False)
    assert array.dtype == np.float32
    if output == "mean":
        parts = list(array)
        assert "x-sentence-lengths" not in head
    else:
        lengths = [int(n) for n in head["x-sentence-lengths"].split(",")]
        assert lengths == [4, 11, 1]
        parts = np.split(array, np.cumsum(lengths)[:-1], axis=-2)
    for s, got in zip(sentences, parts):
        want = expected(embedder, s, output)
        assert got.shape == want.shape and np.abs(got - want).max() <= TOL


def test_openai_embeddings(server, embedder):
    texts = ["The cat sat on the mat.", "Dogs bark!"]
    status, _, body = server.post("/v1/embeddings", {"input": texts, "model": "whatever"})
    assert status == 200, body
    answer = json.loads(body)
    n_tokens = sum(len(tokenize(t)) for t in texts)
    assert answer["object"] == "list" and answer["model"] == server_model_name(server)
    assert answer["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert [d["index"] for d in answer["data"]] == [0, 1] and all(d["object"] == "embedding" for d in answer["data"])
    for t, d in zip(texts, answer["data"]):
        assert np.abs(np.array(d["embedding"]) - expected(embedder, tokenize(t), "mean")).max() <= TOL
    # one string, base64 (what OpenAI's Python client asks for)
    answer = json.loads(server.post("/v1/embeddings", {"input": texts[1], "encoding_format": "base64"})[2])
    vector = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype="<f4")
    assert len(answer["data"]) == 1 and answer["usage"]["prompt_tokens"] == 3
    assert np.abs(vector - expected(embedder, tokenize(texts[1]), "mean")).max() <= TOL


def test_concurrent_clients_get_their_own_vectors(server, embedder):
    """Clients at once, one sentence each, lengths 1..24: merged into shared batches (checked in the
    metrics), every client gets its own sentence's vectors, unpadded and equal to it alone."""
    clients, rounds = 24, 3
    failures, batches = concurrent_clients(server, embedder, clients, rounds, longest=24)
    assert not failures, failures
    assert batches < clients * rounds, "no two requests shared a batch"


# ---------------------------------------------------------------------------------------------
# the examples of docs/serving.md, against this server


def _serving_page() -> str:
    return (REPO / "docs" / "serving.md").read_text(encoding="utf-8")


def test_the_serving_page_python_example_runs(server):
    blocks = re.findall(r"^```py\n(.*?)^```$", _serving_page(), re.M | re.S)
    assert blocks
    for code in blocks:
        namespace: dict = {}
        exec(code.replace("http://127.0.0.1:8080", f"http://{server.host}:{server.port}"), namespace)  # noqa: S102
        assert [v.shape for v in namespace["vectors"]] == [(7, 32), (3, 32)]
        assert namespace["layers"].shape == (3, 3, 32)


def test_the_serving_page_curl_example_works(server):
    import shlex

    lines = [line for line in _serving_page().splitlines() if line.startswith("curl ")]
    assert lines
    for line in lines:
        args = shlex.split(line)
        url = next(a for a in args if a.startswith("http://"))
        body = args[args.index("-d") + 1].encode()
        path = "/" + url.split("/", 3)[3]
        status, _, answer = server.post(path, body)  # curl -d posts the data as it is
        assert status == 200 and json.loads(answer)["dim"] == 32


# ---------------------------------------------------------------------------------------------
# bad input: 4xx, one line of JSON naming the problem; the server goes on


@pytest.mark.parametrize("body,status,kind,text", BAD, ids=[b[3][:30] for b in BAD])
def test_bad_input_to_embed(server, body, status, kind, text):
    got_status, head, got = server.post("/embed", body, {"Content-Type": "application/json"})
    assert got_status == status, got
    assert got.count(b"\n") == 0 and head["content-type"] == "application/json"
    error = json.loads(got)["error"]
    assert error["type"] == kind and text in error["message"], error
    assert server.request("GET", "/health")[0] == 200


@pytest.mark.parametrize("body,text", OPENAI_BAD, ids=[b[1][:30] for b in OPENAI_BAD])
def test_bad_input_to_openai_embeddings(server, body, text):
    status, _, got = server.post("/v1/embeddings", body)
    assert status == 400 and text in json.loads(got)["error"]["message"], got


def test_unknown_routes_and_methods(server):
    status, _, body = server.request("GET", "/embeddings")
    assert status == 404 and "POST /embed" in json.loads(body)["error"]["message"]
    status, _, body = server.request("GET", "/embed")
    assert status == 405 and json.loads(body)["error"]["type"] == "method_not_allowed"


def test_errors_are_counted_by_kind(server):
    before = server.metric('errors_total{kind="malformed_json"}')
    server.post("/embed", b"{")
    assert server.metric('errors_total{kind="malformed_json"}') == before + 1
    assert server.metric('requests_total{endpoint="/embed",status="400"}') >= 1


def test_bad_requests_do_not_disturb_the_good_ones_beside_them(server, embedder):
    rng = np.random.default_rng(4)
    good = random_sentences(rng, [3, 9, 14, 1, 6, 20])
    results: dict[int, tuple] = {}

    def send(i: int) -> None:
        if i % 2:
            results[i] = server.post("/embed", {"sentences": [["ok"], [i]], "output": "mean"})
        else:
            results[i] = server.post("/embed", {"sentences": [good[i // 2]], "output": "mean"})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2 * len(good))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, _, body) in results.items():
        if i % 2:
            assert status == 400
        else:
            assert status == 200
            got = np.array(json.loads(body)["embeddings"][0])
            assert np.abs(got - expected(embedder, good[i // 2], "mean")).max() <= TOL


# ---------------------------------------------------------------------------------------------
# a full queue, a client that hangs up, a stop signal


def _big_request(n_sentences: int, seed: int) -> list[list[str]]:
    return random_sentences(np.random.default_rng(seed), [8] * n_sentences)


class Gated:
    """A real ElmoEmbedder whose batches wait while ``hold`` is set (and say when one is waiting):
    the model's pace under the test's control, so that queues fill at known moments."""

    def __init__(self, embedder) -> None:
        self.embedder = embedder
        self.output_dim = embedder.output_dim
        self.hold = threading.Event()
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.embedded: list[list[str]] = []

    def embed_batch(self, batch):
        if self.hold.is_set():
            self.waiting.set()
            self.release.wait(120)
        self.embedded.extend(batch)
        return self.embedder.embed_batch(batch)


@pytest.fixture
def gated_server(tiny_dir, embedder):
    """The real server, in this process, on a gated model: one sentence per batch, two requests
    in the queue at most."""
    from elmo_fast.serve.server import EmbeddingServer, listen

    gated = Gated(embedder)
    server = EmbeddingServer(
        listen("127.0.0.1", 0),
        lambda: gated,
        "gated",
        lambda e: e.output_dim,
        Limits(max_batch_size=1, max_queue=2),
        RequestLimits(),
    )
    server.host, server.port = server.sock.getsockname()[:2]
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        wait_until(server.batcher.ready.is_set, what="the model to be ready")
        gated.embedded.clear()
        yield server, gated
    finally:
        gated.release.set()
        server.stop()
        thread.join(120)
    assert not thread.is_alive()


def _post_in_thread(server, body, answers, key):
    def send():
        answers[key] = http_request(server.host, server.port, "POST", "/embed", body)

    t = threading.Thread(target=send)
    t.start()
    return t


def test_a_full_queue_answers_503_with_retry_after(gated_server, embedder):
    server, gated = gated_server
    gated.hold.set()
    answers: dict = {}
    sentences = random_sentences(np.random.default_rng(10), [5, 9, 2])
    threads = [_post_in_thread(server, {"sentences": [sentences[0]], "output": "mean"}, answers, 0)]
    assert gated.waiting.wait(60)  # the first request is in the model
    threads += [
        _post_in_thread(server, {"sentences": [s], "output": "mean"}, answers, k)
        for k, s in enumerate(sentences[1:], 1)
    ]
    wait_until(lambda: server.batcher.queue_depth() == 2, what="two requests in the queue")
    status, head, body = http_request(server.host, server.port, "POST", "/embed", {"sentences": [["one", "more"]]})
    assert status == 503 and int(head["retry-after"]) >= 1
    error = json.loads(body)["error"]
    assert error["type"] == "queue_full" and "--max-queue 2" in error["message"]
    gated.release.set()
    for t in threads:
        t.join()
    for k, s in enumerate(sentences):
        status, _, body = answers[k]
        assert status == 200
        assert np.abs(np.array(json.loads(body)["embeddings"][0]) - expected(embedder, s, "mean")).max() <= TOL
    assert http_request(server.host, server.port, "POST", "/embed", {"sentences": [["after"]]})[0] == 200
    assert 'elmo_fast_errors_total{kind="queue_full"} 1' in server.metrics.render()


def test_a_client_that_hangs_up_costs_only_its_own_work(gated_server, embedder):
    server, gated = gated_server
    gated.hold.set()
    answers: dict = {}
    first = ["in", "the", "model"]
    threads = [_post_in_thread(server, {"sentences": [first]}, answers, "first")]
    assert gated.waiting.wait(60)
    big = _big_request(50, 12)
    body = json.dumps({"sentences": big, "output": "all"}).encode()
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(
        b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    wait_until(lambda: server.batcher.queued_sentences() == 50, what="the request in the queue")
    other = ["meanwhile", "another", "client"]
    threads.append(_post_in_thread(server, {"sentences": [other]}, answers, "other"))
    wait_until(lambda: server.batcher.queued_sentences() == 51, what="the other request in the queue")
    sock.close()
    # its sentences leave the queue before the model takes any of them
    wait_until(lambda: server.batcher.queued_sentences() == 1, what="the gone client's sentences to leave")
    gated.release.set()
    for t in threads:
        t.join()
    for key, sentence in (("first", first), ("other", other)):
        status, _, got = answers[key]
        assert status == 200
        assert np.abs(np.array(json.loads(got)["embeddings"][0]) - expected(embedder, sentence, "all")).max() <= TOL
    assert gated.embedded == [first, other]
    assert 'elmo_fast_errors_total{kind="disconnected"} 1' in server.metrics.render()


@pytest.mark.slow
def test_sigterm_answers_what_was_received_and_exits_0(tiny_dir, embedder):
    s = ServerProcess(tiny_dir, "--max-batch-size", 1)
    requests = [_big_request(12, 20 + k) for k in range(4)]
    answers: dict[int, tuple] = {}
    threads = [
        threading.Thread(
            target=lambda k=k: answers.__setitem__(k, s.post("/embed", {"sentences": requests[k], "output": "top"}))
        )
        for k in range(len(requests))
    ]
    for t in threads:
        t.start()
    try:
        # every request received (waiting, or answered already on a fast machine), then the signal
        wait_until(
            lambda: (
                s.metric("queue_depth") + s.metric('requests_total{endpoint="/embed",status="200"}') == len(requests)
            ),
            what="every request in the queue",
        )
        s.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
        assert s.proc.wait(timeout=120) == 0, "".join(s.lines)
    finally:
        s.stop()
    s.wait_for("stopped by SIGTERM", 10)
    for k, (status, _, body) in sorted(answers.items()):
        assert status == 200, (k, body)
        vectors = json.loads(body)["embeddings"]
        assert len(vectors) == 12
        assert np.abs(np.array(vectors[-1]) - expected(embedder, requests[k][-1], "top")).max() <= TOL
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((s.host, s.port), timeout=5)
    free = socket.socket()
    try:
        # the port is free again: a new server binds it (with SO_REUSEADDR, as `elmo-fast serve` does,
        # since the closed connections' TIME_WAIT entries hold the port for a minute otherwise)
        free.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        free.bind((s.host, s.port))
    finally:
        free.close()


def test_health_is_503_until_the_model_is_warm(tiny_dir, embedder):
    """The real server in this process, its model load held back by a gate."""
    from elmo_fast.serve.server import EmbeddingServer, listen

    gate = threading.Event()

    def load():
        gate.wait(120)
        return ElmoEmbedder(model_dir=tiny_dir)

    server = EmbeddingServer(
        listen("127.0.0.1", 0), load, "gated", lambda e: e.output_dim, Limits(), RequestLimits(max_request_tokens=100)
    )
    host, port = server.sock.getsockname()[:2]
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        status, head, body = http_request(host, port, "GET", "/health")
        assert status == 503 and head["retry-after"] == "1" and json.loads(body)["error"]["type"] == "not_ready"
        status, head, body = http_request(host, port, "POST", "/embed", {"sentences": [["early"]]})
        assert status == 503 and json.loads(body)["error"]["type"] == "not_ready"
        gate.set()
        wait_until(lambda: http_request(host, port, "GET", "/health")[0] == 200, what="the model to be ready")
        status, _, body = http_request(host, port, "POST", "/embed", {"sentences": [["now"]], "output": "mean"})
        assert (
            status == 200
            and np.abs(np.array(json.loads(body)["embeddings"][0]) - expected(embedder, ["now"], "mean")).max() <= TOL
        )
    finally:
        gate.set()
        server.stop()
        thread.join(120)
    assert not thread.is_alive()


@pytest.mark.slow
def test_a_second_signal_stops_at_once(tiny_dir):
    """A client stalled halfway through its request holds the graceful stop; a second SIGTERM ends it."""
    s = ServerProcess(tiny_dir)
    stalled = socket.create_connection((s.host, s.port))
    try:
        stalled.sendall(b'POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"sentences"')
        time.sleep(0.5)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert s.proc.poll() is None, "the graceful stop did not wait for the request in progress"
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        stalled.close()
        s.stop()
    s.wait_for("requests in progress were dropped", 10)


# ---------------------------------------------------------------------------------------------
# the command's own refusals


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_2(tiny_dir):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        r = cli_process.run(
            [
                sys.executable,
                "-m",
                "elmo_fast",
                "serve",
                "--model-dir",
                str(tiny_dir),
                "--port",
                str(taken.getsockname()[1]),
                "--max-batch-size",
                "4",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        taken.close()
    assert r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow
def test_a_model_that_fails_to_load_stops_the_server_with_one_line(tmp_path, tiny_dir):
    (tmp_path / "options.json").write_text((tiny_dir / "options.json").read_text())
    (tmp_path / "weights.hdf5").write_bytes(b"not an hdf5 file")
    r = cli_process.run(
        [sys.executable, "-m", "elmo_fast", "serve", "--model-dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "listening on" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("elmo-fast: error:") and "weights.hdf5" in r.stderr


# ---------------------------------------------------------------------------------------------
# the batcher, in process


@pytest.mark.parametrize(
    "lengths,max_size,max_tokens,want",
    [
        ([5, 5, 5], 64, 4096, [0, 1, 2]),  # everything fits
        ([5, 5, 5], 2, 4096, [0, 1]),  # size cap, oldest first among equals
        ([10, 50, 11, 9, 48], 3, 4096, [0, 2, 3]),  # nearest lengths to the oldest
        ([50, 10, 11, 49, 48], 3, 4096, [0, 3, 4]),
        ([30, 30, 30, 30], 64, 90, [0, 1, 2]),  # padded-token cap
        ([500, 3, 3], 64, 100, [0]),  # longer than the cap: alone
        ([3, 500, 3], 64, 100, [0, 2]),
    ],
)
def test_select_batch(lengths, max_size, max_tokens, want):
    assert select_batch(lengths, max_size, max_tokens) == want


def test_select_batch_respects_its_limits():
    rng = np.random.default_rng(5)
    for _ in range(300):
        lengths = list(rng.integers(1, 80, size=rng.integers(1, 100)))
        max_size, max_tokens = int(rng.integers(1, 70)), int(rng.integers(1, 3000))
        chosen = select_batch(lengths, max_size, max_tokens)
        assert chosen[0] == 0 and chosen == sorted(set(chosen)) and len(chosen) <= max_size
        assert len(chosen) == 1 or len(chosen) * max(lengths[i] for i in chosen) <= max_tokens


class _GatedEmbedder:
    """embed_batch returns random arrays of the right shapes, after a gate opens; records batch sizes."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.sizes: list[int] = []
        self.started = threading.Event()

    def embed_batch(self, batch):
        self.started.set()
        self.gate.wait(30)
        self.sizes.append(len(batch))
        return [np.full((3, len(s), 4), float(len(s)), dtype=np.float32) for s in batch]


def _run_batcher(body, limits: Limits):
    import asyncio

    fake = _GatedEmbedder()
    fake.gate.set()
    batcher = Batcher(lambda: fake, limits, Metrics())

    async def main():
        batcher.start(asyncio.get_running_loop(), on_failure=lambda e: None)
        await asyncio.to_thread(batcher.ready.wait, 30)
        fake.sizes.clear()
        try:
            return await body(batcher, fake)
        finally:
            fake.gate.set()
            await asyncio.to_thread(batcher.stop)

    return asyncio.run(main())


def test_requests_that_came_while_the_model_was_busy_share_the_next_batch():
    import asyncio

    async def body(batcher, fake):
        fake.gate.clear()
        fake.started.clear()
        first = batcher.submit([["a"]], "mean")
        await asyncio.to_thread(fake.started.wait, 30)  # the model is busy with the first
        later = [batcher.submit([["b"] * (k + 1)], "top") for k in range(10)]
        fake.gate.set()
        results = await asyncio.gather(first.future, *(j.future for j in later))
        assert [r[0].shape for r in results[1:]] == [(k + 1, 4) for k in range(10)]
        assert all(float(r[0][0, 0]) == k + 1 for k, r in enumerate(results[1:]))
        return fake.sizes

    assert _run_batcher(body, Limits(max_wait_ms=0)) == [1, 10]


def test_a_cancelled_request_leaves_the_queue():
    import asyncio

    async def body(batcher, fake):
        fake.gate.clear()
        fake.started.clear()
        first = batcher.submit([["a"]], "mean")
        await asyncio.to_thread(fake.started.wait, 30)
        gone = batcher.submit([["x"]] * 5, "mean")
        kept = batcher.submit([["y", "y"]], "mean")
        assert batcher.queued_sentences() == 6 and batcher.queue_depth() == 2
        batcher.cancel(gone)
        assert batcher.queued_sentences() == 1 and batcher.queue_depth() == 1
        fake.gate.set()
        await first.future
        assert (await kept.future)[0].shape == (4,)
        with pytest.raises(ConnectionAbortedError):
            await gone.future
        return fake.sizes

    assert _run_batcher(body, Limits(max_wait_ms=0)) == [1, 1]


def test_a_failing_sentence_fails_only_its_request():
    import asyncio

    class Picky(_GatedEmbedder):
        def embed_batch(self, batch):
            if any("boom" in s for s in batch):
                raise RuntimeError("boom")
            return super().embed_batch(batch)

    async def body(batcher, fake):
        jobs = [batcher.submit([["fine"] * (k + 1)], "top") for k in range(4)]
        bad = batcher.submit([["boom"]], "top")
        assert [(await j.future)[0].shape for j in jobs] == [(k + 1, 4) for k in range(4)]
        with pytest.raises(RuntimeError, match="boom"):
            await bad.future

    picky = Picky()
    picky.gate.set()

    async def main():
        batcher = Batcher(lambda: picky, Limits(max_wait_ms=50), Metrics())
        batcher.start(asyncio.get_running_loop(), on_failure=lambda e: None)
        await asyncio.to_thread(batcher.ready.wait, 30)
        try:
            await body(batcher, picky)
        finally:
            await asyncio.to_thread(batcher.stop)

    asyncio.run(main())


def test_a_free_model_waits_for_the_clients_of_its_last_batch():
    """Five clients answered together come back a little apart: one batch of five, not 2 + 3."""
    import asyncio

    async def body(batcher, fake):
        await asyncio.gather(*(j.future for j in [batcher.submit([["w"] * 3], "mean") for _ in range(5)]))
        fake.sizes.clear()
        early = [batcher.submit([["w"] * 3], "mean") for _ in range(2)]
        await asyncio.sleep(0.2)
        late = [batcher.submit([["w"] * 3], "mean") for _ in range(3)]
        await asyncio.gather(*(j.future for j in early + late))
        return fake.sizes

    assert _run_batcher(body, Limits(max_wait_ms=5000)) == [5]


def test_a_lone_client_never_waits():

    async def body(batcher, fake):
        for _ in range(3):
            start = time.perf_counter()
            await batcher.submit([["alone"]], "mean").future
            assert time.perf_counter() - start < 2.5  # far below the 5 s it could wait for company
        return fake.sizes

    assert _run_batcher(body, Limits(max_wait_ms=5000)) == [1, 1, 1]
