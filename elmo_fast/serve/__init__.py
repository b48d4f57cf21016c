"""``elmo-fast serve``: an HTTP embedding server with dynamic batching (the ``[serve]`` extra:
Starlette on uvicorn, orjson).

* :mod:`~elmo_fast.serve.protocol`   request bodies parsed and checked (4xx naming the problem)
* :mod:`~elmo_fast.serve.text`       raw text into tokens and offsets (the one place the server splits text)
* :mod:`~elmo_fast.serve.batcher`    the model thread and the dynamic batcher
* :mod:`~elmo_fast.serve.responses`  JSON / ``.npy`` / OpenAI answers and one-line JSON errors
* :mod:`~elmo_fast.serve.metrics`    Prometheus text for ``GET /metrics``
* :mod:`~elmo_fast.serve.info`       ``GET /info``
* :mod:`~elmo_fast.serve.openapi`    the OpenAPI description; :mod:`~elmo_fast.serve.api_docs` it as a page
* :mod:`~elmo_fast.serve.app`        the routes (a Starlette app)
* :mod:`~elmo_fast.serve.guards`     API key, requests in progress, the body's total deadline (plain ASGI)
* :mod:`~elmo_fast.serve.access`     request ids, the access log, the last-resort 500 (plain ASGI)
* :mod:`~elmo_fast.serve.composition` the served app whole, for any ASGI server
* :mod:`~elmo_fast.serve.connections` the socket cap, the head's total deadline, idle keep-alive (uvicorn's protocol)
* :mod:`~elmo_fast.serve.tls`        the server's TLS context
* :mod:`~elmo_fast.serve.server`     uvicorn, the listening socket, a graceful stop on signals

Nothing in the package imports this room but the CLI and the Ray room (:mod:`elmo_fast.ray`, whose Ray
Serve replicas run the same app): a core install need not have its dependencies.
"""
