"""elmo_fast.ray.serve_app on a local Ray Serve (tests/support/ray_local.py: ray.init(num_cpus=2), once for the
test run; serve.run on a free loopback port): the API of `elmo-fast serve`, answered by the same app
in the replica (tests/serve/test_serve.py's cases: vectors equal to ElmoEmbedder's sentence by sentence, .npy,
OpenAI's API, concurrent clients sharing batches, every bad input's answer, /info, /tokenize, request ids,
the property-based battery of tests/support/serve_fuzz.py), under a route prefix and an API key; a model that
fails to load fails the deployment, naming why; bad settings are one-line errors before anything is
deployed."""

from __future__ import annotations

import base64
import io
import json
import re
import socket

import numpy as np
import pytest
from serve_cases import BAD, OPENAI_BAD, TOL, concurrent_clients, expected, random_sentences
from serve_fuzz import fuzz_every_route
from serve_process import http_request

from elmo_fast.errors import ElmoFastError
from elmo_fast.tokenizer import tokenize

KEY = "ray-s3cret"
PREFIX = "/elmo"


class RayServe:
    """The deployed application's HTTP side: requests under its route prefix, with its key."""

    def __init__(self, port: int, prefix: str, key: str | None) -> None:
        self.host, self.port, self.prefix, self.key = "127.0.0.1", port, prefix, key

    def request(self, method: str, path: str, body=None, headers=None, key: bool = True):
        headers = dict(headers or {})
        if key and self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return http_request(self.host, self.port, method, self.prefix + path, body, headers)

    def post(self, path: str, body, headers=None):
        return self.request("POST", path, body, headers)

    def metric(self, name: str) -> float:
        text = self.request("GET", "/metrics")[2].decode()
        m = re.search(rf"^elmo_fast_{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray(ray_cluster):
    return ray_cluster


@pytest.fixture(scope="module")
def served(ray, tiny_dir):
    from ray import serve

    from elmo_fast.ray import serve_app

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(
            serve_app(
                model_dir=str(tiny_dir),
                max_request_tokens=300,
                max_wait_ms=20,
                api_key=KEY,
                num_replicas=1,
                ray_actor_options={"num_cpus": 1},
            ),
            name="elmo",
            route_prefix=PREFIX,
        )
        yield RayServe(port, PREFIX, KEY)
    finally:
        serve.shutdown()


@pytest.mark.slow
def test_the_deployment_is_what_was_asked(served, tiny_dir):
    from ray import serve

    status = serve.status().applications["elmo"]
    assert status.status == "RUNNING" and status.deployments["elmo-fast"].replica_states == {"RUNNING": 1}
    # ready means warm: the replica answered its first request with the model loaded
    code, _, body = served.request("GET", "/health", key=False)  # /health needs no key
    assert code == 200 and json.loads(body) == {"status": "ok", "model": tiny_dir.name, "dim": 32}


def test_every_route_but_the_open_ones_needs_the_key(served):
    for path in ("/health", "/openapi.json", "/docs"):
        assert served.request("GET", path, key=False)[0] == 200, path
    for method, path in (
        ("POST", "/embed"),
        ("POST", "/v1/embeddings"),
        ("POST", "/tokenize"),
        ("GET", "/info"),
        ("GET", "/metrics"),
    ):
        code, head, body = served.request(method, path, {"texts": ["a"]} if method == "POST" else None, key=False)
        assert code == 401 and body.count(b"\n") == 0 and json.loads(body)["error"]["type"] == "unauthorized"
        assert head["www-authenticate"] == "Bearer"


def test_metrics(served):
    code, head, body = served.request("GET", "/metrics")
    assert code == 200 and head["content-type"].startswith("text/plain")
    for name in (
        "requests_total",
        "errors_total",
        "batch_size_bucket",
        "request_latency_seconds",
        "queue_depth",
        "ready 1",
        "model_busy 0",
    ):
        assert f"elmo_fast_{name}" in body.decode(), name


@pytest.mark.parametrize("output", ["all", "average", "top", "mean"])
def test_embed_equals_the_embedder_sentence_by_sentence(served, embedder, output):
    sentences = random_sentences(np.random.default_rng(1), [7, 1, 19, 2, 33, 5])
    code, _, body = served.post("/embed", {"sentences": sentences, "output": output})
    assert code == 200, body
    answer = json.loads(body)
    assert answer["dim"] == 32 and len(answer["embeddings"]) == len(sentences)
    for s, got in zip(sentences, answer["embeddings"]):
        want = expected(embedder, s, output)
        got = np.array(got, dtype=np.float32)
        assert got.shape == want.shape and np.abs(got - want).max() <= TOL


def test_texts_npy_and_openai(served, embedder):
    texts = ["I don't think John's car costs $1,000.", "Dogs bark!"]
    answer = json.loads(served.post("/embed", {"texts": texts, "output": "average"})[2])
    for t, got in zip(texts, answer["embeddings"]):
        assert np.abs(np.array(got) - expected(embedder, tokenize(t), "average")).max() <= TOL
    code, head, body = served.post("/embed", {"texts": texts, "output": "top"}, {"Accept": "application/x-npy"})
    assert code == 200 and head["content-type"] == "application/x-npy"
    lengths = [int(n) for n in head["x-sentence-lengths"].split(",")]
    parts = np.split(np.load(io.BytesIO(body), allow_pickle=False), np.cumsum(lengths)[:-1], axis=-2)
    for t, got in zip(texts, parts):
        assert np.abs(got - expected(embedder, tokenize(t), "top")).max() <= TOL
    answer = json.loads(served.post("/v1/embeddings", {"input": texts[1], "encoding_format": "base64"})[2])
    vector = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype="<f4")
    assert answer["usage"]["prompt_tokens"] == 3
    assert np.abs(vector - expected(embedder, tokenize(texts[1]), "mean")).max() <= TOL


def test_concurrent_clients_share_batches_in_the_replica(served, embedder):
    clients, rounds = 16, 2
    failures, batches = concurrent_clients(served, embedder, clients, rounds, longest=20)
    assert not failures, failures
    assert batches < clients * rounds, "no two requests shared a batch"


@pytest.mark.parametrize("body,status,kind,text", BAD, ids=[b[3][:30] for b in BAD])
def test_bad_input_gets_the_servers_answers(served, body, status, kind, text):
    code, head, got = served.post("/embed", body, {"Content-Type": "application/json"})
    assert code == status, got
    assert got.count(b"\n") == 0 and head["content-type"] == "application/json"
    error = json.loads(got)["error"]
    assert error["type"] == kind and text in error["message"], error


@pytest.mark.parametrize("body,text", OPENAI_BAD, ids=[b[1][:30] for b in OPENAI_BAD])
def test_bad_openai_input_gets_the_servers_answers(served, body, text):
    code, _, got = served.post("/v1/embeddings", body)
    assert code == 400 and text in json.loads(got)["error"]["message"], got


def test_unknown_routes_and_methods(served):
    code, _, body = served.request("GET", "/embeddings")
    assert code == 404 and "POST /embed" in json.loads(body)["error"]["message"]
    code, _, body = served.request("GET", "/embed")
    assert code == 405 and json.loads(body)["error"]["type"] == "method_not_allowed"


def test_info_tokenize_and_request_ids(served, tiny_dir):
    code, head, body = served.request("GET", "/info", headers={"X-Request-Id": "ray-info-1"})
    info = json.loads(body)
    assert code == 200 and head["x-request-id"] == "ray-info-1"
    assert info["model_id"] == tiny_dir.name and info["dim"] == 32 and info["max_request_tokens"] == 300
    assert set(info["model_files"]) == {"options.json", "weights.hdf5"}
    code, _, body = served.post("/tokenize", {"inputs": "Dogs bark!"})
    assert [t["text"] for t in json.loads(body)["tokens"][0]] == ["Dogs", "bark", "!"]
    code, head, body = served.post("/embed", {"texts": 3}, {"X-Request-Id": "ray-bad-1"})
    assert code == 400 and json.loads(body)["error"]["request_id"] == "ray-bad-1" == head["x-request-id"]


#: generated requests per route: fewer than the server's own battery (each goes through Ray's proxy)
FUZZ_EXAMPLES = {
    "POST /embed": 150,
    "POST /v1/embeddings": 100,
    "POST /tokenize": 100,
    "GET /info": 40,
    "GET /health": 30,
    "GET /metrics": 30,
    "GET /openapi.json": 30,
    "GET /docs": 30,
}


def test_every_route_fuzzed_from_the_description(served):
    """tests/serve/test_serve_fuzz.py's battery, against the deployment's app behind Ray's proxy."""
    auth = {"Authorization": f"Bearer {KEY}"}
    sent = fuzz_every_route(f"http://{served.host}:{served.port}{served.prefix}", auth, FUZZ_EXAMPLES)
    assert sum(sent.values()) >= 500, sent
    assert served.request("GET", "/health", key=False)[0] == 200
    code, _, body = served.post("/embed", {"sentences": [["still", "fine"]], "output": "mean"})
    assert code == 200 and len(json.loads(body)["embeddings"][0]) == 32


@pytest.mark.slow
def test_a_model_that_fails_to_load_fails_the_deployment_naming_why(served, tmp_path):
    from ray import serve

    from elmo_fast.ray import serve_app

    (tmp_path / "options.json").write_text("{}")  # a directory that looks like a model, and is not one
    (tmp_path / "weights.hdf5").write_bytes(b"not hdf5")
    with pytest.raises(RuntimeError, match="Deploying application broken failed"):
        serve.run(  # (one try: Ray's default is 3 per replica, each a replica's start, for the same error)
            serve_app(model_dir=str(tmp_path), ray_actor_options={"num_cpus": 0.5}, max_constructor_retry_count=1),
            name="broken",
            route_prefix="/broken",
        )
    message = serve.status().applications["broken"].deployments["elmo-fast"].message
    assert "elmo-fast: the model failed to load: " in message and "options.json" in message, message
    serve.delete("broken")
    assert served.request("GET", "/health", key=False)[0] == 200  # the other application is untouched


@pytest.mark.parametrize(
    "kwargs,text",
    [
        (dict(max_batch_size=0), "max_batch_size must be an integer >= 1, got 0"),
        (dict(max_wait_ms=-1), "max_wait_ms must be >= 0, got -1"),
        (dict(max_request_tokens=0), "max_request_tokens must be an integer >= 1, got 0"),
        (dict(max_client_batch_size=0), "max_client_batch_size must be an integer >= 1, got 0"),
        (dict(api_key=" "), "api_key is empty"),
        (dict(max_connections=0), "max_connections must be an integer >= 1, got 0"),
        (dict(read_timeout=0), "read_timeout must be > 0 seconds or None, got 0"),
        (dict(backend="gpu"), "backend must be 'auto', 'fast' or 'reference'"),
        (dict(precision="fp8"), "fp8"),
        (dict(model="nope"), "model: unknown model 'nope'"),
    ],
)
def test_bad_settings_are_one_line_errors_before_deploying(kwargs, text):
    pytest.importorskip("ray.serve", reason='Ray Serve is not installed: pip install "elmo-fast[ray]"')
    from elmo_fast.ray import serve_app

    with pytest.raises(ElmoFastError) as info:
        serve_app(**kwargs)
    assert text in str(info.value) and "\n" not in str(info.value)
