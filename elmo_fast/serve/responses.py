"""Response bodies: JSON (orjson writes float32 arrays directly, ~30x faster than ``json`` on
``tolist()``), ``.npy`` for clients that ask for it, and the one-line JSON errors.

Why ``.npy``: with ``"output": "all"`` a 25-token sentence of the ``original`` model is 76,800
floats. As JSON that is 0.8 MB and ~5 ms to encode with orjson (~140 ms with ``json`` on
``tolist()``), and as much again to parse on the client, against ~20 ms of model time per sentence
at batch 64 (fp32, 2 cores); as ``.npy`` it is 0.3 MB, written and read in microseconds
(BENCHMARKS.md, "Serving"). The per-sentence ``"mean"`` vector costs ~0.06 ms as JSON.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np
import orjson

NPY = "application/x-npy"
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def error_body(message: str, kind: str, request_id: str | None = None, error_id: str | None = None) -> bytes:
    """OpenAI's error shape, one line: ``{"error": {"message": ..., "type": kind, "request_id": ...}}``;
    ``error_id``: the id under which the server logged an internal error's details."""
    error = {"message": message, "type": kind}
    if error_id is not None:
        error["id"] = error_id
    if request_id is not None:
        error["request_id"] = request_id
    return orjson.dumps({"error": error})


def internal_error_body(error_id: str, request_id: str | None) -> bytes:
    """A 500's body: nothing of the failure but the id its traceback is logged under."""
    message = f"internal error: the server's log holds its details under the id {error_id}"
    return error_body(message, "internal", request_id, error_id)


def wants_npy(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for ``.npy`` rather than JSON."""
    return bool(accept) and NPY in accept


def embed_json(vectors: Sequence[np.ndarray], model: str, dim: int, truncated: Sequence[int] = ()) -> bytes:
    """``{"embeddings": [...], "model": model, "dim": dim}``: one nested list per sentence; ``"truncated"``:
    the indices of the sentences cut to --max-request-tokens (--auto-truncate), when there are any."""
    body = {"embeddings": list(vectors), "model": model, "dim": dim}
    if truncated:
        body["truncated"] = list(truncated)
    return orjson.dumps(body, option=_JSON_OPTIONS)


def tokenize_json(texts: Sequence[Sequence[tuple[str, int, int]]], truncated: Sequence[int] = ()) -> bytes:
    """``{"tokens": [[{"text": ..., "start": ..., "stop": ...}, ...], ...]}``, one list per text."""
    body = {"tokens": [[{"text": t, "start": a, "stop": b} for t, a, b in tokens] for tokens in texts]}
    if truncated:
        body["truncated"] = list(truncated)
    return orjson.dumps(body)


def embed_npy(vectors: Sequence[np.ndarray], output: str) -> tuple[bytes, list[int]]:
    """One ``.npy`` array for the whole request and the sentences' token counts.

    ``"mean"``: [N, D]. Otherwise the sentences one after another along the token axis, unpadded:
    [L + 1, sum(T_i), D] for ``"all"``, [sum(T_i), D] for ``"average"`` and ``"top"``; the token
    counts (sent as the ``X-Sentence-Lengths`` header) split it back:
    ``np.split(a, np.cumsum(lengths)[:-1], axis=-2)``.
    """
    if output == "mean":
        array, lengths = np.stack(vectors), []
    else:
        array = np.concatenate(vectors, axis=-2)
        lengths = [v.shape[-2] for v in vectors]
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array, dtype="<f4"), allow_pickle=False)
    return buf.getvalue(), lengths


def openai_json(vectors: Sequence[np.ndarray], model: str, tokens: int, encoding: str) -> bytes:
    """OpenAI's embeddings response; ``encoding`` "base64" sends each vector's little-endian float32 bytes."""
    if encoding == "base64":
        data = [base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        data = list(vectors)
    return orjson.dumps(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        option=_JSON_OPTIONS,
    )
