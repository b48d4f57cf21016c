"""``elmo-fast serve``: an HTTP embedding server with dynamic batching (:mod:`elmo_fast.serve`).

The model flags are ``embed``'s; the server's own say where it listens and how it batches. Needs
the ``[serve]`` extra (``pip install "elmo-fast[serve]"``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import ElmoFastError
from ..serve import defaults
from .common import add_backend_flags, add_precision_flag, onnx_file, param_flags

_NEEDS = ("starlette", "uvicorn", "orjson")


def model_source(args: argparse.Namespace) -> tuple[dict, str]:
    """ElmoEmbedder's model arguments from --model / --model-dir / --options + --weights (none: the
    bundled model), and the name the answers give the model. Checks what can be checked before
    loading; fetches a named model into the cache (as ``embed`` does)."""
    if args.model_dir:
        if args.model or args.options or args.weights:
            raise ElmoFastError("give one of --model-dir DIR, --model NAME or --options F --weights F")
        if not os.path.isdir(args.model_dir):
            raise ElmoFastError(f"--model-dir {args.model_dir}: not a directory")
        return (
            dict(model_dir=args.model_dir, model_format=args.model_format),
            os.path.basename(os.path.normpath(args.model_dir)),
        )
    if args.model_format:
        raise ElmoFastError(
            "--model-format picks the model of a --model-dir DIR that holds both kinds; give it with --model-dir"
        )
    if args.model:
        from ..pretrained import fetch, parse_model_spec

        if args.options or args.weights:
            raise ElmoFastError("give either --model NAME or --options F --weights F, not both")
        parse_model_spec(args.model)  # a bad name fails in one line before anything is fetched
        return fetch(args.model, progress=True).constructor_args(), args.model
    if bool(args.options) != bool(args.weights):
        raise ElmoFastError(
            "give --options F and --weights F together (or --model NAME, or --model-dir DIR, or none "
            "of them for the bundled model)"
        )
    if args.options:
        for flag, path in (("--options", args.options), ("--weights", args.weights)):
            if not os.path.isfile(path):
                raise ElmoFastError(f"{flag} {path}: file not found")
        name = os.path.basename(os.path.dirname(os.path.abspath(args.options))) or "model"
        return dict(options_file=args.options, weight_file=args.weights), name
    from ..pretrained.bundled import NAME, USING_MESSAGE, bundled_model

    print(USING_MESSAGE, file=sys.stderr)
    return dict(model_dir=str(bundled_model().directory)), NAME


API_KEY_ENV = "ELMO_FAST_API_KEY"
KEY_PASSWORD_ENV = "ELMO_FAST_SSL_KEYFILE_PASSWORD"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def read_key_file(path: str) -> str:
    """The API key in FILE (its first line), refused when others than its owner may read the file."""
    import stat

    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise ElmoFastError(f"--api-key-file {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ElmoFastError(f"--api-key-file {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ElmoFastError(
            f"--api-key-file {path}: readable by others than its owner (mode {stat.S_IMODE(mode):04o}); "
            f"chmod 600 {path}"
        )
    key = lines[0].strip() if lines else ""
    if not key:
        raise ElmoFastError(f"--api-key-file {path}: its first line is empty: put the key there")
    return key


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key-file, --api-key or $ELMO_FAST_API_KEY (never printed)."""
    if args.api_key_file is not None:
        if args.api_key is not None:
            raise ElmoFastError("give --api-key or --api-key-file, not both")
        return read_key_file(args.api_key_file)
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ElmoFastError(f"--api-key (or {API_KEY_ENV}) is empty: give a key, or leave both unset")
    return key.strip() if key else None


def _exposure(args: argparse.Namespace):
    """The server's guards from --api-key / --api-key-file (or $ELMO_FAST_API_KEY), --max-connections,
    --read-timeout, --keep-alive-timeout and the TLS flags, checked (the key itself is never printed)."""
    from ..serve.server import Exposure

    key = _api_key(args)
    if args.max_connections < 0:
        raise ElmoFastError(f"--max-connections must be >= 1 (0: no cap), got {args.max_connections}")
    if args.read_timeout <= 0:
        raise ElmoFastError(f"--read-timeout must be > 0 seconds, got {args.read_timeout:g}")
    if args.keep_alive_timeout <= 0:
        raise ElmoFastError(f"--keep-alive-timeout must be > 0 seconds, got {args.keep_alive_timeout:g}")
    password = args.ssl_keyfile_password if args.ssl_keyfile_password is not None else os.environ.get(KEY_PASSWORD_ENV)
    if args.ssl_keyfile and not args.ssl_certfile:
        raise ElmoFastError("--ssl-keyfile needs --ssl-certfile (the certificate it goes with)")
    if args.ssl_keyfile_password is not None and not args.ssl_certfile:
        raise ElmoFastError("--ssl-keyfile-password needs --ssl-certfile (and the encrypted key it opens)")
    for flag, path in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if path and not os.path.isfile(path):
            raise ElmoFastError(f"{flag} {path}: file not found")
    context = None
    if args.ssl_certfile:
        from ..serve.tls import server_context

        context = server_context(args.ssl_certfile, args.ssl_keyfile, password)  # now, not once the model loaded
    if key is None and args.host not in _LOOPBACK:
        print(
            f"elmo-fast serve: note: listening on {args.host} without --api-key: anyone who reaches this port "
            f"can use the server (keep the default --host 127.0.0.1 unless behind a key or a proxy)",
            file=sys.stderr,
        )
    return Exposure(
        api_key=key,
        max_connections=args.max_connections or None,
        read_timeout=args.read_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        ssl_context=context,
    )


def _check_limits(args: argparse.Namespace) -> None:
    for flag in ("max_batch_size", "max_batch_tokens", "max_queue", "max_request_tokens", "max_client_batch_size"):
        if getattr(args, flag) < 1:
            raise ElmoFastError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.payload_limit is not None and args.payload_limit < 1024:
        raise ElmoFastError(f"--payload-limit must be >= 1024 bytes, got {args.payload_limit}")
    if args.max_wait_ms < 0:
        raise ElmoFastError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms:g}")
    if not 0 <= args.port <= 65535:
        raise ElmoFastError(f"--port must be between 0 and 65535 (0: any free port), got {args.port}")


def run(args: argparse.Namespace) -> int:
    _check_limits(args)
    try:
        from ..serve.batcher import Limits
        from ..serve.protocol import RequestLimits
        from ..serve.server import run_server
    except ImportError as e:
        if e.name not in _NEEDS:
            raise
        raise ElmoFastError(
            f'elmo-fast serve needs the [serve] extra (missing: {e.name}): pip install "elmo-fast[serve]"'
        ) from None
    from ..devices import resolve_device
    from ..embedding.embedder import ElmoEmbedder

    exposure = _exposure(args)

    from ..bilm.precision import resolve_precision

    device = resolve_device(args.device)
    resolve_precision(args.precision).check_device(device)  # before listening or loading
    graph = onnx_file(args)
    if graph is not None:  # an exported graph holds the model (embedding/onnx_backend.py)
        from ..embedding.onnx_backend import check_onnx_settings

        check_onnx_settings(graph, False, device, False, args.precision)
        model, name = dict(onnx_file=graph), os.path.splitext(os.path.basename(graph))[0]
    else:
        model, name = model_source(args)

    def load():
        return ElmoEmbedder(**model, device=device, backend=args.backend, precision=args.precision)

    limits = Limits(
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
    )
    signum, forced = run_server(
        load,
        name,
        lambda embedder: embedder.output_dim,
        limits,
        RequestLimits(
            max_request_tokens=args.max_request_tokens,
            max_client_batch_size=args.max_client_batch_size,
            payload_limit=args.payload_limit,
            auto_truncate=args.auto_truncate,
        ),
        args.host,
        args.port,
        log_level=args.log_level,
        exposure=exposure,
    )
    why = f"stopped by {signum.name}" if signum else "stopped"
    if forced:  # a second signal: what was still in progress was dropped
        print(f"elmo-fast serve: {why} (a second signal): requests in progress were dropped", file=sys.stderr)
        return 128 + signum
    print(f"elmo-fast serve: {why}; every request received was answered", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    from ..pretrained import model_names

    p = sub.add_parser(
        "serve",
        help="an HTTP embedding server with dynamic batching (the [serve] extra)",
        description="Serve a biLM over HTTP: POST /embed (tokens or raw text; all layers, their "
        "average, the top layer or a mean vector), POST /v1/embeddings (OpenAI's "
        "embeddings API), POST /tokenize, GET /info, GET /health, GET /metrics (Prometheus), "
        "GET /openapi.json and GET /docs (the API described). Concurrent requests' "
        "sentences are merged into batches. SIGTERM, SIGINT (Ctrl-C) or SIGHUP: stop "
        "accepting, answer what was received, exit 0; a second one: stop at once.",
    )
    p.add_argument("--options", "--options-file", help="options.json of the model")
    p.add_argument("--weights", "--weight-file", help="weights.hdf5 of the model, bilm-tf layout")
    p.add_argument(
        "--model-dir",
        metavar="DIR",
        help="a model directory: bilm-tf's (options.json + weights.hdf5) or ELMoForManyLangs'",
    )
    p.add_argument(
        "--model-format",
        choices=["bilm-tf", "elmoformanylangs"],
        help="which model to load from a --model-dir that holds both kinds",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help=f"a model by name: 'default' (bundled, offline; also used when no model is given), an "
        f"official one ({', '.join(model_names()[1:])}), hf:OWNER/REPO[@REVISION][/SUBFOLDER] (the Hugging "
        f"Face Hub; the [hub] extra), or URL#sha256=HEX (a folder holding options.json and weights.hdf5); "
        f"fetched once into the cache (elmo-fast models list)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    add_backend_flags(p)
    add_precision_flag(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0: all). Keep the default unless the server "
        "is behind --api-key or a proxy that checks who calls",
    )
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0: any free port, printed)")
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=64,
        metavar="N",
        help="at most N sentences per model batch (default 64; 1 turns batching off)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=4096,
        metavar="N",
        help="at most N padded tokens (sentences x longest) per batch (default 4096); a longer sentence runs alone",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        metavar="MS",
        help="how long a free model waits for the clients it expects before running a smaller batch "
        "(default 5; a lone client never waits)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        metavar="N",
        help="requests waiting for a batch before new ones get 503 + Retry-After (default 1024)",
    )
    p.add_argument(
        "--max-request-tokens",
        type=int,
        default=defaults.MAX_REQUEST_TOKENS,
        metavar="N",
        help=f"tokens one request may hold; more: 413 (default {defaults.MAX_REQUEST_TOKENS})",
    )
    p.add_argument(
        "--max-client-batch-size",
        type=int,
        default=defaults.MAX_CLIENT_BATCH_SIZE,
        metavar="N",
        help=f"sentences (texts, inputs) one request may hold; more: 413 (default {defaults.MAX_CLIENT_BATCH_SIZE})",
    )
    p.add_argument(
        "--auto-truncate",
        action="store_true",
        help="cut a sentence longer than --max-request-tokens to that many tokens instead of refusing the "
        "request (the answer names the sentences cut: 'truncated', X-Truncated)",
    )
    p.add_argument(
        "--payload-limit",
        type=int,
        metavar="BYTES",
        help="the largest request body; more: 413 (default 65536 + 256 x --max-request-tokens: 2,162,688 bytes "
        "at the default)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every route but /health, /openapi.json and /docs (401 "
        f"otherwise); better: --api-key-file or ${API_KEY_ENV}, which keep the key out of the process list",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="read the API key from the first line of FILE (which only its owner may read: chmod 600)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=defaults.MAX_CONNECTIONS,
        metavar="N",
        help=f"at most N open connections; one more is answered 503 and closed at once (default "
        f"{defaults.MAX_CONNECTIONS}; 0: no cap)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=defaults.READ_TIMEOUT,
        metavar="S",
        help="seconds in all a client has to send a request's headers (from connecting, or from the first byte "
        "of its next request), and then its whole body (408); past them it is disconnected; also the TLS "
        f"handshake's (default {defaults.READ_TIMEOUT:g})",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=defaults.KEEP_ALIVE_TIMEOUT,
        metavar="S",
        help=f"seconds an idle connection is kept open after an answer (default {defaults.KEEP_ALIVE_TIMEOUT:g})",
    )
    p.add_argument("--ssl-certfile", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", metavar="FILE", help="its private key (PEM), when it is not in --ssl-certfile")
    p.add_argument(
        "--ssl-keyfile-password",
        metavar="PASSWORD",
        help=f"the password of an encrypted private key (better: ${KEY_PASSWORD_ENV}, out of the process list)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default warning)",
    )
    p.set_defaults(func=run, flags=param_flags(p, {"onnx_file": "onnx"}))
