"""What clients of text-embeddings-inference script against, on `elmo-fast serve`: GET /info, POST /tokenize,
--max-client-batch-size, --auto-truncate, --payload-limit, the OpenAPI description (real answers validated
against it) and its /docs page, a request id on every answer, error and access log line; a 500 that shows
nothing but an id; secrets in no repr, log line or metric."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from serve_cases import TOL, expected
from serve_process import ServerProcess, http_request

from elmo_fast import __version__
from elmo_fast.serve import text
from elmo_fast.serve.batcher import Limits
from elmo_fast.serve.protocol import RequestLimits
from elmo_fast.tokenizer import tokenize

KEY = "api-Key-for-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = " ".join(f"w{i}" for i in range(30))  # 30 tokens


@pytest.fixture(scope="module")
def server(tiny_dir):
    s = ServerProcess(
        tiny_dir,
        "--api-key",
        KEY,
        "--max-request-tokens",
        20,
        "--max-client-batch-size",
        3,
        "--auto-truncate",
        "--payload-limit",
        4096,
        "--log-level",
        "info",
    )
    yield s
    assert s.stop() == 0
    assert KEY not in "".join(s.lines)


@pytest.fixture(scope="module")
def description(server):
    status, head, body = server.request("GET", "/openapi.json")
    assert status == 200 and head["content-type"] == "application/json"
    return json.loads(body)


def validate(description: dict, path: str, method: str, status: int, body: bytes, content_type: str) -> None:
    """A real answer against the description: its status is listed, its body matches the schema."""
    import jsonschema

    responses = description["paths"][path][method]["responses"]
    assert str(status) in responses, (path, method, status)
    media = content_type.split(";")[0]
    schema = responses[str(status)]["content"][media]["schema"]
    if media != "application/json":
        return
    resolver_doc = {**schema, "components": description["components"]}
    jsonschema.Draft202012Validator(resolver_doc).validate(json.loads(body))


def call(server, description, method: str, path: str, body=None, headers=None):
    status, head, data = server.request(method, path, body, {**AUTH, **(headers or {})})
    validate(description, path, method.lower(), status, data, head["content-type"])
    return status, head, data


@pytest.mark.slow
def test_info_says_what_is_served(server, description, tiny_dir):
    import hashlib

    status, _, body = call(server, description, "GET", "/info")
    info = json.loads(body)
    assert status == 200
    assert info["model_id"] == tiny_dir.name and info["dim"] == 32 and info["layers"] == 3
    assert info["model_files"] == {
        name: hashlib.sha256((tiny_dir / name).read_bytes()).hexdigest() for name in ("options.json", "weights.hdf5")
    }
    assert info["precision"] == "fp32" and info["backend"] in ("fast", "reference") and info["device"] == "cpu"
    assert info["state_mode"] == "stateless" and info["version"] == __version__
    assert (info["max_request_tokens"], info["max_client_batch_size"], info["payload_limit"]) == (20, 3, 4096)
    assert info["auto_truncate"] is True and info["max_batch_size"] == 64 and info["max_batch_tokens"] == 4096
    assert info["license"] is None  # a model of the user's own: its terms are not elmo-fast's to say


def test_the_bundled_models_state_their_licences():
    from elmo_fast.pretrained.bundled import BUNDLED
    from elmo_fast.serve.info import licence_terms

    terms = licence_terms({"weights": str(BUNDLED["default"] / "weights.hdf5")})
    assert terms and terms.startswith("Apache-2.0")
    terms = licence_terms({"weights": str(BUNDLED["default-v1"] / "weights.hdf5")})
    assert terms and "GPL" in terms and "not Apache-2.0" in terms
    mixed = {
        "options": str(BUNDLED["default"] / "options.json"),
        "weights": str(BUNDLED["default-v1"] / "weights.hdf5"),
    }
    assert licence_terms(mixed) is None  # files of two models: neither's terms
    assert licence_terms({"weights": "/elsewhere/weights.hdf5"}) is None


def test_tokenize_shows_what_texts_are_embedded_as(server, description, embedder):
    texts = ["I don't think John's car costs $1,000.", "  Hello,\tworld!  "]
    status, _, body = call(server, description, "POST", "/tokenize", {"texts": texts})
    assert status == 200
    got = json.loads(body)["tokens"]
    for t, tokens in zip(texts, got):
        assert [x["text"] for x in tokens] == tokenize(t)
        assert all(t[x["start"] : x["stop"]] == x["text"] for x in tokens)
    status, _, body = call(server, description, "POST", "/tokenize", {"inputs": texts[1]})
    assert [x["text"] for x in json.loads(body)["tokens"][0]] == ["Hello", ",", "world", "!"]
    # /embed's vectors for the same texts are those of these tokens
    status, _, body = call(server, description, "POST", "/embed", {"texts": texts[1:], "output": "mean"})
    vector = np.array(json.loads(body)["embeddings"][0])
    assert np.abs(vector - expected(embedder, ["Hello", ",", "world", "!"], "mean")).max() <= TOL


@pytest.mark.parametrize("value", ["", " ", "a", "ab  cd", "x\u00e9\u4e2d\U0001f600!", "e.g. U.S. don't--see", "\t\n"])
def test_offsets_are_places_in_the_text(value):
    pieces = text.split_with_offsets(value)
    assert [p[0] for p in pieces] == tokenize(value)
    assert all(value[a:b] == t for t, a, b in pieces) and all(
        b <= a2 for (_, _, b), (_, a2, _) in zip(pieces, pieces[1:])
    )


def test_max_client_batch_size(server, description):
    for path, body in (
        ("/embed", {"sentences": [["a"]] * 4}),
        ("/embed", {"texts": ["a"] * 4}),
        ("/v1/embeddings", {"input": ["a"] * 4}),
        ("/tokenize", {"texts": ["a"] * 4}),
    ):
        status, _, data = call(server, description, "POST", path, body)
        error = json.loads(data)["error"]
        assert status == 413 and "--max-client-batch-size" in error["message"] and "4 items" in error["message"]
    assert call(server, description, "POST", "/embed", {"sentences": [["a"]] * 3})[0] == 200


def test_auto_truncate_cuts_long_sentences_and_says_so(server, description, embedder):
    words = LONG.split()
    for body in ({"texts": [LONG], "output": "top"}, {"sentences": [words], "output": "top"}):
        status, head, data = call(server, description, "POST", "/embed", body)
        answer = json.loads(data)
        assert status == 200 and answer["truncated"] == [0] and head["x-truncated"] == "0"
        assert np.array(answer["embeddings"][0]).shape == (20, 32)
        assert np.abs(np.array(answer["embeddings"][0]) - expected(embedder, words[:20], "top")).max() <= TOL
    status, head, body = call(server, description, "POST", "/v1/embeddings", {"input": LONG})
    assert status == 200 and head["x-truncated"] == "0" and json.loads(body)["usage"]["prompt_tokens"] == 20
    status, head, body = call(server, description, "POST", "/tokenize", {"texts": [LONG]})
    assert json.loads(body)["truncated"] == [0] and len(json.loads(body)["tokens"][0]) == 20
    # the total is still bounded: two sentences of 15 tokens are not cut, and are too many together
    status, _, body = call(server, description, "POST", "/embed", {"sentences": [["w"] * 15] * 2})
    assert status == 413 and "--max-request-tokens" in json.loads(body)["error"]["message"]
    status, head, body = call(server, description, "POST", "/embed", {"sentences": [["w"] * 5], "output": "mean"})
    assert "truncated" not in json.loads(body) and "x-truncated" not in head


def test_without_auto_truncate_a_long_sentence_is_refused_naming_the_flag():
    from elmo_fast.serve.protocol import RequestError, parse_embed

    with pytest.raises(RequestError, match="--auto-truncate") as e:
        parse_embed(json.dumps({"sentences": [["w"] * 21]}).encode(), RequestLimits(max_request_tokens=20))
    assert e.value.status == 413


def test_payload_limit(server, description):
    status, _, body = call(server, description, "POST", "/embed", {"texts": ["x" * 5000]})
    error = json.loads(body)["error"]
    assert status == 413 and "4096 bytes" in error["message"] and "--payload-limit 4096" in error["message"]


def test_every_answer_carries_a_request_id(server, description):
    status, head, body = call(server, description, "POST", "/embed", {"sentences": 5}, {"X-Request-Id": "trace-42"})
    assert (
        status == 400 and head["x-request-id"] == "trace-42" and json.loads(body)["error"]["request_id"] == "trace-42"
    )
    ids = set()
    for path in ("/health", "/info", "/metrics", "/docs"):
        status, head, _ = call(server, description, "GET", path)
        assert status == 200 and len(head["x-request-id"]) == 32
        ids.add(head["x-request-id"])
    assert len(ids) == 4  # made fresh each time
    status, head, _ = call(server, description, "GET", "/health", headers={"X-Request-Id": "bad id\twith spaces"})
    assert head["x-request-id"] != "bad id\twith spaces" and len(head["x-request-id"]) == 32
    status, head, body = server.request("GET", "/info", headers={"X-Request-Id": "no-key"})  # the guard's 401
    assert status == 401 and json.loads(body)["error"]["request_id"] == "no-key" == head["x-request-id"]
    status, head, body = server.request("GET", "/nowhere", headers={**AUTH, "X-Request-Id": "lost"})
    assert status == 404 and json.loads(body)["error"]["request_id"] == "lost"
    server.wait_for("request_id=lost", 10)  # the access log line
    line = server.wait_for("request_id=trace-42", 10) if not any("trace-42" in x for x in server.lines) else ""
    assert any('"POST /embed HTTP/1.1" 400' in x and "request_id=trace-42" in x for x in server.lines), line


def test_the_description_covers_every_route(server, description):
    from elmo_fast.serve.app import ROUTES

    described = {f"{m.upper()} {p}" for p, item in description["paths"].items() for m in item}
    assert described == set(ROUTES.split(", "))
    for item in description["paths"].values():
        for op in item.values():
            for status, answer in op["responses"].items():
                if status != "200":
                    assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    import jsonschema

    jsonschema.Draft202012Validator.check_schema({"$defs": description["components"]["schemas"]})


def test_the_docs_page_is_whole_and_offline(server, description):
    import re

    status, head, body = call(server, description, "GET", "/docs")
    page = body.decode()
    assert status == 200 and head["content-type"].startswith("text/html")
    assert not re.search(r"<script|<link|src=|url\(|@import", page, re.I)  # nothing fetched from anywhere
    for path in description["paths"]:
        assert f'<span class="path">{path}</span>' in page
    assert 'id="schema-EmbedRequest"' in page and "--max-client-batch-size" in page


def test_the_openai_and_embed_answers_match_the_description(server, description):
    call(server, description, "POST", "/v1/embeddings", {"input": ["a b", "c"], "encoding_format": "base64"})
    call(server, description, "POST", "/v1/embeddings", {"input": "a b"})
    for output in ("all", "average", "top", "mean"):
        assert call(server, description, "POST", "/embed", {"sentences": [["a", "b"]], "output": output})[0] == 200
    status, head, _ = call(
        server, description, "POST", "/embed", {"sentences": [["a"]]}, {"Accept": "application/x-npy"}
    )
    assert status == 200 and head["content-type"] == "application/x-npy"


# ---- nothing internal leaks --------------------------------------------------------------------------


class Failing:
    """An embedder whose batches fail with a message full of internals."""

    output_dim = 8

    def embed_batch(self, batch):
        if batch and batch[0] and batch[0][0] == "boom":
            raise RuntimeError("/secret/path/weights.hdf5: internal state 0xdeadbeef")
        return [np.zeros((3, len(s), 8), dtype=np.float32) for s in batch]


def test_a_500_shows_only_an_id_whose_traceback_is_logged(caplog):
    from elmo_fast.serve.server import EmbeddingServer, Exposure, listen

    server = EmbeddingServer(
        listen("127.0.0.1", 0),
        Failing,
        "failing",
        lambda e: e.output_dim,
        Limits(),
        RequestLimits(),
        exposure=Exposure(api_key=KEY),
    )
    host, port = server.sock.getsockname()[:2]
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        import time

        deadline = time.monotonic() + 120
        while http_request(host, port, "GET", "/health")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with caplog.at_level("ERROR", logger="elmo_fast.serve"):
            status, head, body = http_request(
                host, port, "POST", "/embed", {"sentences": [["boom"]]}, {**AUTH, "X-Request-Id": "r-500"}
            )
        assert status == 500 and body.count(b"\n") == 0
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "id", "request_id"} and error["type"] == "internal"
        assert error["request_id"] == "r-500" and error["id"] in error["message"]
        assert b"secret" not in body and b"deadbeef" not in body and b"RuntimeError" not in body
        logged = [r for r in caplog.records if error["id"] in r.getMessage()]
        assert logged and logged[0].exc_info and "deadbeef" in str(logged[0].exc_info[1])
        assert "r-500" in logged[0].getMessage()
        status, _, metrics = http_request(host, port, "GET", "/metrics", headers=AUTH)
        assert status == 200 and KEY not in metrics.decode() and 'errors_total{kind="internal"} 1' in metrics.decode()
        assert http_request(host, port, "POST", "/embed", {"sentences": [["fine"]]}, AUTH)[0] == 200
    finally:
        server.stop()
        thread.join(120)
    assert KEY not in caplog.text


def test_secrets_are_in_no_repr():
    from elmo_fast.ray.replica_settings import ReplicaSettings
    from elmo_fast.serve.guards import Guards
    from elmo_fast.serve.server import Exposure

    for thing in (Exposure(api_key=KEY), ReplicaSettings(api_key=KEY), Guards(lambda *a: None, api_key=KEY)):
        assert KEY not in repr(thing) and KEY not in str(thing), thing


def test_the_api_key_file_is_read_when_only_its_owner_may_read_it(tmp_path, monkeypatch):
    import argparse

    from elmo_fast.cli.serve import _exposure

    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    monkeypatch.delenv("ELMO_FAST_API_KEY", raising=False)
    args = argparse.Namespace(
        api_key=None,
        api_key_file=str(path),
        max_connections=512,
        read_timeout=30.0,
        keep_alive_timeout=5.0,
        ssl_certfile=None,
        ssl_keyfile=None,
        ssl_keyfile_password=None,
        host="127.0.0.1",
    )
    assert _exposure(args).api_key == KEY
