"""What the server tests and the Ray Serve tests (tests/cluster/test_ray_serve.py) hold a server to: the bound, random
sentences, a sentence's expected vectors, and the bad requests with the answers they get; and the model both serve
(``tiny_dir``) with an in-process embedder of it (``embedder``) to compare the answers with."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

TOL = 1e-5  # fp32: a sentence's vectors in any batch vs alone (GEMM rounding ~1e-6)


def random_sentences(rng, lengths) -> list[list[str]]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFG"))
    return [["".join(rng.choice(letters, size=rng.integers(1, 12))) for _ in range(n)] for n in lengths]


def expected(embedder, sentence, output):
    a = embedder.embed_sentence(sentence)  # alone: no other sentence in its batch
    return {
        "all": a,
        "average": a.mean(axis=0),
        "sum": a.sum(axis=0),
        "top": a[-1],
        "mean": a.mean(axis=0).mean(axis=0),
    }[output]


BAD = [
    (b"{not json", 400, "malformed_json", "not valid JSON"),
    (b"", 400, "malformed_json", "body is empty"),
    (b"[1, 2]", 400, "invalid_request", "must be a JSON object"),
    (b'{"sentences": "The cat sat"}', 400, "invalid_request", "'sentences' must be a list"),
    (b'{"sentences": []}', 400, "invalid_request", "'sentences' is empty"),
    (b'{"sentences": [["a"], []]}', 400, "invalid_request", "sentences[1] is empty"),
    (b'{"sentences": [["a"], "b c"]}', 400, "invalid_request", "sentences[1] must be a list of token strings"),
    (b'{"sentences": [["a", "b"], ["c", 5]]}', 400, "invalid_request", "sentences[1][1] must be a string"),
    (b'{"sentences": [["a", null]]}', 400, "invalid_request", "sentences[0][1] must be a string (a token), got null"),
    (b'{"texts": ["fine", 3]}', 400, "invalid_request", "texts[1] must be a string"),
    (b'{"texts": ["fine", "   "]}', 400, "invalid_request", "texts[1] has no tokens"),
    (b'{"texts": []}', 400, "invalid_request", "'texts' is empty"),
    (b'{"texts": ["a"], "sentences": [["a"]]}', 400, "invalid_request", "not both"),
    (b'{"sentence": [["a"]]}', 400, "invalid_request", "unknown field 'sentence'"),
    (b'{"sentences": [["a"]], "output": "avg"}', 400, "invalid_request", "'output' must be one of"),
    (
        json.dumps({"sentences": [["w"] * 301]}).encode(),
        413,
        "too_large",
        "301 tokens, over this server's limit of 300",
    ),
    (json.dumps({"texts": ["w " * 200, "w " * 101]}).encode(), 413, "too_large", "--max-request-tokens"),
    (b'{"sentences": [["' + b"x" * 200_000 + b'"]]}', 413, "too_large", "request body is over"),
]


OPENAI_BAD = [
    ({"model": "x"}, "missing field 'input'"),
    ({"input": [1, 2, 3]}, "token ids are not supported"),
    ({"input": ""}, "'input' has no tokens"),
    ({"input": []}, "'input' is empty"),
    ({"input": "a", "encoding_format": "int8"}, "'encoding_format' must be one of"),
    ({"input": "a", "dimensions": 8}, "this model's vectors have 32 dimensions"),
]


def concurrent_clients(server, embedder, clients: int, rounds: int, longest: int) -> tuple[list[str], int]:
    """``clients`` threads released together, each posting ``rounds`` one-sentence requests (lengths
    1..``longest``, seeded) to ``server`` (``post`` and ``metric`` as tests/support/serve_process.py's):
    the clients whose vectors were not their sentence's alone (within TOL), and how many batches ran."""
    rng = np.random.default_rng(3)
    sentences = random_sentences(rng, rng.permutation(np.arange(1, clients * rounds + 1) % longest + 1))
    batches_before = server.metric("batch_size_count")
    barrier = threading.Barrier(clients)
    failures: list[str] = []

    def client(i: int) -> None:
        for r in range(rounds):
            s = sentences[i * rounds + r]
            if r == 0:
                barrier.wait()
            status, _, body = server.post("/embed", {"sentences": [s], "output": "all"})
            got = np.array(json.loads(body)["embeddings"][0], dtype=np.float32) if status == 200 else None
            want = expected(embedder, s, "all")
            if got is None or got.shape != want.shape or np.abs(got - want).max() > TOL:
                failures.append(f"client {i} round {r}: status {status}, shape {None if got is None else got.shape}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures, server.metric("batch_size_count") - batches_before


@pytest.fixture(scope="module")
def tiny_dir(random_models):
    """The tiny random model the servers serve (a model directory)."""
    options, _ = random_models("tiny", seed=7)
    return options.parent


@pytest.fixture(scope="module")
def embedder(tiny_dir):
    """An in-process ElmoEmbedder of that model."""
    from elmo_fast import ElmoEmbedder

    return ElmoEmbedder(model_dir=tiny_dir)
