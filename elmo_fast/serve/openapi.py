"""The OpenAPI 3.1 description of the server's API, served at ``GET /openapi.json`` (and rendered for
people at ``GET /docs``, :mod:`.api_docs`): every route, its request and response bodies, its errors.
Written by hand, once, beside the routes it describes; the tests check real answers against it
(``tests/serve/test_serve_api.py``) and fuzz every route from it."""

from __future__ import annotations

from typing import Any

from .. import __version__
from .protocol import ENCODINGS, OUTPUTS

REF = "#/components/schemas/"


def _ref(name: str) -> dict:
    return {"$ref": REF + name}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


_ERRORS = {
    "400": "malformed JSON, a field of the wrong type, an empty list or sentence, an unknown field",
    "401": "no API key, or the wrong one (a server started with --api-key)",
    "408": "the request's body did not arrive within --read-timeout",
    "413": "over --payload-limit bytes, --max-client-batch-size sentences or --max-request-tokens tokens",
    "500": "an internal error: the body holds only the id its details are logged under",
    "503": "the model is still loading, the queue is full (--max-queue) or the server is stopping: retry after "
    "Retry-After seconds",
}


def _errors(*codes: str) -> dict:
    out = {}
    for code in codes:
        out[code] = {"description": _ERRORS[code], "content": _json(_ref("Error")), "headers": _REQUEST_ID_HEADER}
        if code == "503":
            out[code]["headers"] = {**_REQUEST_ID_HEADER, "Retry-After": {"schema": {"type": "integer"}}}
    return out


_REQUEST_ID_HEADER = {
    "X-Request-Id": {
        "description": "the request's id: the client's X-Request-Id when sane, else one made by the server",
        "schema": {"type": "string"},
    }
}
_REQUEST_ID_PARAMETER = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "description": "an id for the request (1 to 128 of A-Z a-z 0-9 . _ : @ / + = -), echoed in the answer, its "
    "error body and the access log; another value is replaced by one the server makes",
    "schema": {"type": "string"},
}


def _ok(description: str, content: dict) -> dict:
    return {"200": {"description": description, "content": content, "headers": _REQUEST_ID_HEADER}}


def _post(summary: str, description: str, request: str, ok: dict, errors=("400", "401", "408", "413", "500", "503")):
    return {
        "post": {
            "summary": summary,
            "description": description,
            "parameters": [_REQUEST_ID_PARAMETER],
            "requestBody": {"required": True, "content": _json(_ref(request))},
            "responses": {**ok, **_errors(*errors)},
        }
    }


def _get(summary: str, description: str, ok: dict, errors=("401", "500"), open_route: bool = False):
    op = {
        "summary": summary,
        "description": description,
        "parameters": [_REQUEST_ID_PARAMETER],
        "responses": {**ok, **_errors(*errors)},
    }
    if open_route:
        op["security"] = []
    return {"get": op}


_STRINGS = {"type": "array", "minItems": 1, "items": {"type": "string"}}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "every answer other than a 2xx: one line of JSON",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "request_id"],
                "additionalProperties": False,
                "properties": {
                    "message": {"type": "string", "description": "one line naming the problem"},
                    "type": {"type": "string", "description": "its kind, as counted by elmo_fast_errors_total"},
                    "request_id": {"type": "string"},
                    "id": {"type": "string", "description": "(500 only) the id the details are logged under"},
                },
            }
        },
    },
    "EmbedRequest": {
        "type": "object",
        "additionalProperties": False,
        "description": "'sentences' (tokens) or 'texts' (raw text, split as POST /tokenize shows), not both",
        "properties": {
            "sentences": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            },
            "texts": {**_STRINGS, "items": {"type": "string", "pattern": r"\S"}},
            "output": {
                "enum": list(OUTPUTS),
                "default": "all",
                "description": "all: layers x tokens x dim; average, sum, top: tokens x dim; mean: one vector",
            },
        },
        "oneOf": [{"required": ["sentences"]}, {"required": ["texts"]}],
    },
    "Vectors": {
        "description": "a vector (numbers), or a list of them, nested as 'output' says",
        "anyOf": [{"type": "number"}, {"type": "array", "items": {"$ref": REF + "Vectors"}}],
    },
    "EmbedResponse": {
        "type": "object",
        "required": ["embeddings", "model", "dim"],
        "additionalProperties": False,
        "properties": {
            "embeddings": {"type": "array", "items": _ref("Vectors")},
            "model": {"type": "string"},
            "dim": {"type": "integer"},
            "truncated": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "the sentences cut to --max-request-tokens (--auto-truncate), when any",
            },
        },
    },
    "OpenAIRequest": {
        "type": "object",
        "required": ["input"],
        "description": "OpenAI's embeddings request; other fields (user, ...) are accepted and ignored",
        "properties": {
            "input": {"anyOf": [{"type": "string", "pattern": r"\S"}, {**_STRINGS, "items": {"type": "string"}}]},
            "model": {"type": "string", "description": "accepted whatever it says: one model is served"},
            "encoding_format": {"enum": list(ENCODINGS), "default": "float"},
            "dimensions": {"type": "integer", "description": "if given, the model's own"},
        },
    },
    "OpenAIResponse": {
        "type": "object",
        "required": ["object", "data", "model", "usage"],
        "additionalProperties": False,
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["object", "index", "embedding"],
                    "additionalProperties": False,
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {
                            "anyOf": [
                                {"type": "array", "items": {"type": "number"}},
                                {"type": "string", "description": "base64 of little-endian float32"},
                            ]
                        },
                    },
                },
            },
            "model": {"type": "string"},
            "usage": {
                "type": "object",
                "required": ["prompt_tokens", "total_tokens"],
                "additionalProperties": False,
                "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            },
        },
    },
    "TokenizeRequest": {
        "type": "object",
        "additionalProperties": False,
        "description": "'texts' (as POST /embed takes them) or 'inputs' (text-embeddings-inference's name)",
        "properties": {
            "texts": _STRINGS,
            "inputs": {"anyOf": [{"type": "string"}, _STRINGS]},
        },
        "oneOf": [{"required": ["texts"]}, {"required": ["inputs"]}],
    },
    "TokenizeResponse": {
        "type": "object",
        "required": ["tokens"],
        "additionalProperties": False,
        "properties": {
            "tokens": {
                "type": "array",
                "description": "per text, its tokens: text[start:stop] (character offsets)",
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["text", "start", "stop"],
                        "additionalProperties": False,
                        "properties": {
                            "text": {"type": "string"},
                            "start": {"type": "integer", "minimum": 0},
                            "stop": {"type": "integer", "minimum": 1},
                        },
                    },
                },
            },
            "truncated": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "the texts an embedding cuts to --max-request-tokens (--auto-truncate), when any",
            },
        },
    },
    "Info": {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "model_id",
            "model_files",
            "dim",
            "layers",
            "precision",
            "backend",
            "device",
            "state_mode",
            "max_batch_size",
            "max_batch_tokens",
            "max_request_tokens",
            "max_client_batch_size",
            "payload_limit",
            "auto_truncate",
            "version",
            "license",
        ],
        "properties": {
            "model_id": {"type": "string", "description": "the model's name"},
            "model_files": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "file name -> SHA-256 of each file the model was read from",
            },
            "dim": {"type": "integer"},
            "layers": {"type": "integer", "description": "layers of vectors per token (the char CNN's + the LSTMs')"},
            "precision": {"type": "string"},
            "backend": {"type": "string"},
            "device": {"type": "string"},
            "state_mode": {"enum": ["stateless", "stateful"]},
            "max_batch_size": {"type": "integer"},
            "max_batch_tokens": {"type": "integer"},
            "max_request_tokens": {"type": "integer"},
            "max_client_batch_size": {"type": "integer"},
            "payload_limit": {"type": "integer"},
            "auto_truncate": {"type": "boolean"},
            "version": {"type": "string", "description": "elmo-fast's"},
            "license": {"type": ["string", "null"], "description": "the model's licence terms, when known"},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "description": "'status' says how the server is; other fields describe it",
        "properties": {"status": {"type": "string"}, "model": {"type": "string"}, "dim": {"type": "integer"}},
    },
}


def describe() -> dict:
    """The whole OpenAPI document (a fresh dict each call)."""
    text = {"text/plain": {"schema": {"type": "string"}}}
    paths = {
        "/embed": _post(
            "Embed sentences",
            "Each sentence's vectors, as ElmoEmbedder gives it alone. With 'Accept: application/x-npy' one float32 "
            ".npy array instead (the sentences' token counts in X-Sentence-Lengths).",
            "EmbedRequest",
            _ok(
                "the vectors",
                {
                    **_json(_ref("EmbedResponse")),
                    "application/x-npy": {"schema": {"type": "string", "contentMediaType": "application/x-npy"}},
                },
            ),
        ),
        "/v1/embeddings": _post(
            "OpenAI's embeddings API",
            "The 'mean' vector of each input text (split as POST /tokenize shows).",
            "OpenAIRequest",
            _ok("the vectors", _json(_ref("OpenAIResponse"))),
        ),
        "/tokenize": _post(
            "Split texts into tokens",
            "The tokens 'texts' and 'input' are embedded as, with their character offsets.",
            "TokenizeRequest",
            _ok("the tokens", _json(_ref("TokenizeResponse"))),
            errors=("400", "401", "408", "413", "500"),
        ),
        "/info": _get(
            "What is served",
            "The model, how it runs, and the server's limits (503 until the model is loaded).",
            _ok("", _json(_ref("Info"))),
            errors=("401", "500", "503"),
        ),
        "/health": _get(
            "Whether the server is ready",
            "200 once the model is loaded and warm, 503 before. Needs no API key.",
            _ok("ready", _json(_ref("Health"))),
            errors=("500", "503"),
            open_route=True,
        ),
        "/metrics": _get("Prometheus metrics", "Prometheus' text format (0.0.4).", _ok("the metrics", text)),
        "/openapi.json": _get(
            "This description",
            "OpenAPI 3.1. Needs no API key.",
            _ok("", _json({"type": "object"})),
            errors=("500",),
            open_route=True,
        ),
        "/docs": _get(
            "This description, for people",
            "An HTML page (self-contained). Needs no API key.",
            _ok("", {"text/html": {"schema": {"type": "string"}}}),
            errors=("500",),
            open_route=True,
        ),
    }
    for item in paths.values():
        for op in item.values():
            op["operationId"] = op["summary"].lower().replace(" ", "_").replace("'", "")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "elmo-fast serve",
            "version": __version__,
            "description": "ELMo embeddings over HTTP, with dynamic batching. Every error is one line of JSON "
            "(Error); every answer carries X-Request-Id.",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "--api-key"}},
        },
        "security": [{"bearer": []}],
    }
