"""The Ray Serve tests serve the model the server's tests serve, and compare with the same in-process
embedder (tests/support/serve_cases.py)."""

from serve_cases import embedder, tiny_dir  # noqa: F401
