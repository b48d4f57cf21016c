"""What a request may say: the bodies of ``POST /embed`` and ``POST /v1/embeddings`` parsed and
checked before anything is queued, so that a bad request is refused alone (a 4xx naming the
problem) and never reaches a batch that other requests share.

Every refusal is a :class:`RequestError`: an HTTP status, a kind (the label of the errors metric)
and a one-line message naming the field, its index and what was found instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..output_shapes import OUTPUTS, unknown_output
from . import text
from .defaults import MAX_CLIENT_BATCH_SIZE, MAX_REQUEST_TOKENS

# ``"output"`` of /embed: one of OUTPUTS, every front's (elmo_fast.output_shapes): layers x tokens x dim
# ("all"), tokens x dim (the mean or the sum of the layers, or the top layer), or one vector ("mean")
DEFAULT_OUTPUT = "all"
#: ``encoding_format`` of /v1/embeddings: a list of floats, or base64 of the little-endian float32 bytes
#: (what OpenAI's Python client asks for by default)
ENCODINGS = ("float", "base64")

_EMBED_FIELDS = ("sentences", "texts", "output")
_TOKENIZE_FIELDS = ("texts", "inputs")


class RequestError(Exception):
    """A request the server refuses: ``status`` (400, 413, 503...), ``kind`` (e.g. ``"invalid_request"``),
    a one-line ``message``, and ``retry_after`` seconds for a 503."""

    def __init__(self, status: int, kind: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.retry_after = retry_after


def invalid(message: str) -> RequestError:
    return RequestError(400, "invalid_request", message)


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold: ``max_request_tokens`` tokens in all (--max-request-tokens),
    ``max_client_batch_size`` sentences (--max-client-batch-size), ``payload_limit`` bytes of body
    (--payload-limit; None: :func:`body_limit` of the tokens); ``auto_truncate``: a sentence longer
    than ``max_request_tokens`` is cut to that many tokens (the answer names it) instead of refused."""

    max_request_tokens: int = MAX_REQUEST_TOKENS
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE
    payload_limit: int | None = None
    auto_truncate: bool = False

    @property
    def payload_bytes(self) -> int:
        return self.payload_limit if self.payload_limit is not None else body_limit(self.max_request_tokens)


@dataclass(frozen=True)
class EmbedRequest:
    """A checked request: its sentences (each a non-empty list of token strings), what to return
    for each, how many tokens they hold, and which of them were cut to --max-request-tokens."""

    sentences: list[list[str]]
    output: str
    tokens: int
    truncated: tuple[int, ...] = ()


@dataclass(frozen=True)
class OpenAIRequest:
    """A checked ``/v1/embeddings`` request: its inputs tokenized, and how to encode the vectors."""

    sentences: list[list[str]]
    encoding_format: str
    tokens: int
    truncated: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenizeRequest:
    """A checked ``/tokenize`` request: its texts, each as ``(token, start, stop)``, and which of them
    an embedding would cut to --max-request-tokens (``--auto-truncate``)."""

    texts: list[list[tuple[str, int, int]]]
    truncated: tuple[int, ...] = ()


def body_limit(max_request_tokens: int) -> int:
    """The largest body a request of ``max_request_tokens`` tokens is let send by default: room for
    JSON's quoting and long tokens (a token is cut to 50 characters by the character ids anyway)."""
    return 65536 + 256 * max_request_tokens


def _describe(value: object) -> str:
    """``a number 5``, ``a string "The cat"``, ``null``: what was found, briefly."""
    if value is None:
        return "null"
    text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() if _jsonable(value) else repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{_type_name(value)} {text}"


def _jsonable(value: object) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict)) or value is None


def _type_name(value: object) -> str:
    return {
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def parse_json(body: bytes) -> object:
    """The body as JSON, or a 400 naming where it stops being JSON."""
    if not body.strip():
        raise RequestError(400, "malformed_json", "the request body is empty: send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise RequestError(400, "malformed_json", f"the request body is not valid JSON: {e}") from None


def _check_tokens(sentences: list[list], limits: RequestLimits) -> int:
    """The request's tokens, or a 413 over --max-request-tokens."""
    tokens = sum(map(len, sentences))
    if tokens > limits.max_request_tokens:
        alone = any(len(s) > limits.max_request_tokens for s in sentences)
        raise RequestError(
            413,
            "too_large",
            f"the request holds {tokens} tokens, over this server's limit of "
            f"{limits.max_request_tokens} (--max-request-tokens): split it into several requests"
            + (" (a server started with --auto-truncate cuts a sentence that long)" if alone else ""),
        )
    return tokens


def _check_count(n: int, field: str, limits: RequestLimits) -> None:
    if n > limits.max_client_batch_size:
        raise RequestError(
            413,
            "too_large",
            f"'{field}' holds {n} items, over this server's limit of {limits.max_client_batch_size} "
            f"(--max-client-batch-size): split it into several requests",
        )


def _truncate(sentences: list, limits: RequestLimits) -> tuple[int, ...]:
    """With --auto-truncate, each sentence longer than --max-request-tokens cut to that many tokens (in
    place); the indices of those cut."""
    if not limits.auto_truncate:
        return ()
    cut = tuple(i for i, s in enumerate(sentences) if len(s) > limits.max_request_tokens)
    for i in cut:
        sentences[i] = sentences[i][: limits.max_request_tokens]
    return cut


def _sentences(value: object, limits: RequestLimits) -> list[list[str]]:
    if not isinstance(value, list):
        raise invalid(f"'sentences' must be a list of sentences (each a list of token strings), got {_describe(value)}")
    if not value:
        raise invalid("'sentences' is empty: give at least one sentence")
    _check_count(len(value), "sentences", limits)
    for i, sentence in enumerate(value):
        if not isinstance(sentence, list):
            hint = "; for raw text send 'texts' instead" if isinstance(sentence, str) else ""
            raise invalid(f"sentences[{i}] must be a list of token strings, got {_describe(sentence)}{hint}")
        if not sentence:
            raise invalid(f"sentences[{i}] is empty: a sentence needs at least one token")
        for j, token in enumerate(sentence):
            if not isinstance(token, str):
                raise invalid(f"sentences[{i}][{j}] must be a string (a token), got {_describe(token)}")
    return list(value)


def _texts(value: object, field: str, limits: RequestLimits, plural: bool = True, split=text.split) -> list[list]:
    """Raw texts -> their tokens (:mod:`.text`, as ``embed --tokenize``); none may be empty."""
    if isinstance(value, str) and not plural:
        value = [value]
        name = lambda i: f"'{field}'"  # noqa: E731
    elif not isinstance(value, list):
        expected = "a string or a list of strings" if not plural else "a list of strings"
        raise invalid(f"'{field}' must be {expected}, got {_describe(value)}")
    else:
        name = lambda i: f"{field}[{i}]"  # noqa: E731
    if not value:
        raise invalid(f"'{field}' is empty: give at least one text")
    _check_count(len(value), field, limits)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            ids = " (token ids are not supported: send the text)" if isinstance(item, (int, list)) else ""
            raise invalid(f"{name(i)} must be a string, got {_describe(item)}{ids}")
        tokens = split(item)
        if not tokens:
            raise invalid(f"{name(i)} has no tokens (it is empty or all whitespace)")
        out.append(tokens)
    return out


def parse_embed(body: bytes, limits: RequestLimits) -> EmbedRequest:
    """The body of ``POST /embed``: ``{"sentences": [[token, ...], ...]}`` or ``{"texts": [str, ...]}``,
    and ``"output"`` (one of OUTPUTS, default DEFAULT_OUTPUT)."""
    data = parse_json(body)
    if not isinstance(data, dict):
        raise invalid(f"the body must be a JSON object with 'sentences' or 'texts', got {_describe(data)}")
    unknown = [k for k in data if k not in _EMBED_FIELDS]
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}; the fields are {', '.join(map(repr, _EMBED_FIELDS))}")
    if ("sentences" in data) == ("texts" in data):
        raise invalid(
            "give either 'sentences' (lists of tokens) or 'texts' (raw strings, tokenized by the server)"
            + (", not both" if "sentences" in data else "")
        )
    output = data.get("output", DEFAULT_OUTPUT)
    if output not in OUTPUTS:
        raise invalid(f"'output' {unknown_output(output)}")
    if "sentences" in data:
        sentences = _sentences(data["sentences"], limits)
    else:
        sentences = _texts(data["texts"], "texts", limits)
    truncated = _truncate(sentences, limits)
    tokens = _check_tokens(sentences, limits)
    return EmbedRequest(sentences, output, tokens, truncated)


def parse_openai(body: bytes, limits: RequestLimits, dim: int) -> OpenAIRequest:
    """The body of ``POST /v1/embeddings`` (OpenAI's embeddings API): ``input`` a string or a list of
    strings; ``encoding_format`` "float" (default) or "base64"; ``dimensions``, if given, must be
    the model's; ``model`` and ``user`` are accepted (one model is served, whatever it is called)."""
    data = parse_json(body)
    if not isinstance(data, dict):
        raise invalid(f"the body must be a JSON object with 'input', got {_describe(data)}")
    if "input" not in data:
        raise invalid("missing field 'input': a string or a list of strings")
    encoding = data.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise invalid(f"'encoding_format' must be one of {', '.join(map(repr, ENCODINGS))}, got {_describe(encoding)}")
    dimensions = data.get("dimensions")
    if dimensions is not None and dimensions != dim:
        raise invalid(
            f"'dimensions' is {_describe(dimensions)}, but this model's vectors have {dim} dimensions (leave it out)"
        )
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid(f"'model' must be a string, got {_describe(model)}")
    sentences = _texts(data["input"], "input", limits, plural=False)
    truncated = _truncate(sentences, limits)
    tokens = _check_tokens(sentences, limits)
    return OpenAIRequest(sentences, encoding, tokens, truncated)


def parse_tokenize(body: bytes, limits: RequestLimits) -> TokenizeRequest:
    """The body of ``POST /tokenize``: ``{"texts": [str, ...]}`` (as ``/embed`` takes them) or
    ``{"inputs": str or [str, ...]}`` (text-embeddings-inference's name)."""
    data = parse_json(body)
    if not isinstance(data, dict):
        raise invalid(f"the body must be a JSON object with 'texts' or 'inputs', got {_describe(data)}")
    unknown = [k for k in data if k not in _TOKENIZE_FIELDS]
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}; the fields are {', '.join(map(repr, _TOKENIZE_FIELDS))}")
    if ("texts" in data) == ("inputs" in data):
        raise invalid("give either 'texts' (a list of strings) or 'inputs' (a string or a list of strings)")
    field = "texts" if "texts" in data else "inputs"
    texts = _texts(data[field], field, limits, plural=field == "texts", split=text.split_with_offsets)
    return TokenizeRequest(texts, _truncate(texts, limits))
