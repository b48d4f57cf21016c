"""The property-based battery both servers face (tests/serve/test_serve_fuzz.py: `elmo-fast serve`;
tests/cluster/test_ray_serve.py: the Ray Serve deployment): schemathesis reads the server's own
/openapi.json and generates requests for every route from it, valid ones and ones that break the schema
(wrong types, missing fields, extra fields), and checks each answer: no 5xx, the status, content type,
headers and body as the description says, every 4xx one line of JSON naming its request's id."""

from __future__ import annotations

import json
import urllib.request

import pytest

INSTALL = 'pip install "elmo-fast[test]" (schemathesis)'


def _load(base_url: str, headers: dict):
    try:
        import schemathesis
    except ImportError as e:
        pytest.skip(f"the fuzzing battery needs schemathesis ({e}): {INSTALL}")
    with urllib.request.urlopen(urllib.request.Request(base_url + "/openapi.json", headers=headers)) as r:
        description = json.load(r)
    return schemathesis, description


def fuzz_every_route(base_url: str, headers: dict, examples: dict[str, int]) -> dict[str, int]:
    """Drive each route of the server at ``base_url`` (``headers`` on every request, say its key) with
    ``examples[method path]`` generated requests (half valid, half not); the requests sent, by route."""
    schemathesis, description = _load(base_url, headers)
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
    ]
    schema = schemathesis.openapi.from_dict(description)
    sent: dict[str, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    routes = {f"{op.method.upper()} {op.path}" for op in operations}
    assert routes == set(examples), f"the battery's routes {sorted(examples)} are not the description's {routes}"
    for op in operations:
        label = f"{op.method.upper()} {op.path}"
        strategy = st.one_of(op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE))
        sent[label] = 0

        @settings(
            max_examples=examples[label],
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=["generate"],
        )
        @given(case=strategy)
        def one(case) -> None:
            response = case.call(base_url=base_url, headers=headers, timeout=120)
            sent[label] += 1
            status, body = response.status_code, response.content
            assert status < 500, f"{label}: {status} {body[:300]!r} for {case.as_curl_command()}"
            if 400 <= status < 500:
                assert body.count(b"\n") == 0, (label, body[:300])
                error = json.loads(body)["error"]
                assert error["message"] and error["type"], (label, error)
                assert [error["request_id"]] == response.headers["x-request-id"], (label, error, response.headers)
            case.validate_response(response, checks=checks, headers=headers)

        one()
    return sent
