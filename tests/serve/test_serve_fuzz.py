"""`elmo-fast serve` fuzzed from its own OpenAPI description (tests/support/serve_fuzz.py): at least 500
generated requests over every route, valid and not, under an API key: no 5xx, every answer as the
description says, every 4xx one line of JSON; the server healthy and answering correctly afterwards."""

from __future__ import annotations

import json

import pytest
from serve_fuzz import fuzz_every_route
from serve_process import ServerProcess

KEY = "fuzz-Key"

#: generated requests per route: the routes that take a body get the most
EXAMPLES = {
    "POST /embed": 150,
    "POST /v1/embeddings": 100,
    "POST /tokenize": 100,
    "GET /info": 40,
    "GET /health": 30,
    "GET /metrics": 30,
    "GET /openapi.json": 30,
    "GET /docs": 30,
}


@pytest.fixture(scope="module")
def server(random_models):
    options, _ = random_models("tiny", seed=7)
    s = ServerProcess(options.parent, "--api-key", KEY, "--max-request-tokens", 400, "--max-client-batch-size", 40)
    yield s
    assert s.stop() == 0


@pytest.mark.slow
def test_every_route_fuzzed_from_the_description(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    sent = fuzz_every_route(f"http://{server.host}:{server.port}", auth, EXAMPLES)
    assert sum(sent.values()) >= 500, sent
    assert server.request("GET", "/health")[0] == 200
    status, _, body = server.post("/embed", {"sentences": [["still", "fine"]], "output": "mean"}, auth)
    assert status == 200 and len(json.loads(body)["embeddings"][0]) == 32
    assert "Traceback" not in "".join(server.lines), "".join(server.lines)[-3000:]
