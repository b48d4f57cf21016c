"""``elmo-fast serve``: an HTTP embedding server with dynamic batching (the ``[serve]`` extra:
Starlette on uvicorn, orjson).

* :mod:`~elmo_fast.serve.protocol`   request bodies parsed and checked (4xx naming the problem)
* :mod:`~elmo_fast.serve.batcher`    the model thread and the dynamic batcher
* :mod:`~elmo_fast.serve.responses`  JSON / ``.npy`` / OpenAI answers and one-line JSON errors
* :mod:`~elmo_fast.serve.metrics`    Prometheus text for ``GET /metrics``
* :mod:`~elmo_fast.serve.app`        the routes (a Starlette app)
* :mod:`~elmo_fast.serve.guards`     API key, connections in progress, the body's read deadline (plain ASGI)
* :mod:`~elmo_fast.serve.composition` the served app whole (batcher, metrics, routes, guards), for any ASGI server
* :mod:`~elmo_fast.serve.server`     uvicorn, the listening socket, a graceful stop on signals

Nothing in the package imports this room but the CLI and the Ray room (:mod:`elmo_fast.ray`, whose Ray
Serve replicas run the same app): a core install need not have its dependencies.
"""
