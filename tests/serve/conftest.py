"""What the server's tests share: the tiny random model they serve, and an in-process embedder of it to
compare the answers with (tests/support/serve_cases.py, shared with the Ray Serve tests)."""

from serve_cases import embedder, tiny_dir  # noqa: F401
