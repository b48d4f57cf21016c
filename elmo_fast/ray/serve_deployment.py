"""``elmo-fast serve`` on Ray Serve: :func:`serve_app` gives an application whose replicas each run the
server's app (:func:`elmo_fast.serve.composition.compose`: the same routes, ``/embed``,
``/v1/embeddings``, ``/tokenize``, ``/info``, ``/health``, ``/metrics``, ``/openapi.json``, ``/docs``, the same
dynamic batcher and bad-input answers, the same guards and request ids), built on the replica (``serve.ingress``'s ``__serve_build_asgi_app__``) with the model loaded
there, on the GPU Ray gave it if any. Ray runs the replicas, routes requests among them and scales
them (``num_replicas``, ``autoscaling_config``)::

    from ray import serve
    from elmo_fast.ray import serve_app

    serve.run(serve_app(model="original", num_replicas=2, ray_actor_options={"num_gpus": 1}))
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve

from ..serve import defaults
from ..serve.batcher import Limits
from ..serve.composition import ServedApp, compose
from ..serve.protocol import RequestLimits
from .actor_resources import actor_device, use_assigned_cpus
from .model_choice import ModelChoice
from .replica_settings import ReplicaSettings
from .until_warm import until_warm

#: requests Ray hands one replica at once (Ray's own default, 5, would cap a dynamic batch at 5 requests);
#: Ray queues the others until a replica takes them
DEFAULT_MAX_ONGOING_REQUESTS = 256


@serve.deployment(name="elmo-fast", max_ongoing_requests=DEFAULT_MAX_ONGOING_REQUESTS)
@serve.ingress()
class ElmoDeployment:
    """One replica: ``elmo-fast serve``'s app, built on the replica from :class:`ReplicaSettings`."""

    def __init__(self, settings: ReplicaSettings) -> None:
        self.settings = settings
        self.served: ServedApp | None = None

    def __serve_build_asgi_app__(self):
        s = self.settings
        use_assigned_cpus()
        device = actor_device(s.device)
        settled = asyncio.Event()  # the model is warm, or failed to load

        def load():
            return s.model.load(device, backend=s.backend, precision=s.precision)

        self.served = served = compose(
            load,
            s.model.name,
            lambda embedder: embedder.output_dim,
            s.limits,
            s.request_limits,
            lambda error: settled.set(),
            settled.set,
            api_key=s.key(),
            max_in_progress=s.max_connections,
            read_timeout=s.read_timeout,
            ids_from_proxy=True,  # Ray's proxy passes each request's X-Request-Id and answers with it
        )
        return until_warm(served.app, settled)

    def check_health(self) -> None:
        """Ray's check, first when the replica has started (its model then warm or failed), then every
        few seconds: a model that failed to load fails the replica, naming why (Ray shows it in the
        deployment's status, and retries the replica a few times)."""
        if self.served is not None and self.served.batcher.error is not None:
            error = self.served.batcher.error
            raise RuntimeError(f"elmo-fast: the model failed to load: {type(error).__name__}: {error}")


def serve_app(
    *,
    model: str | None = None,
    model_dir: str | None = None,
    options_file: str | None = None,
    weight_file: str | None = None,
    model_format: str | None = None,
    device: str | None = None,
    backend: str = "auto",
    precision: str | None = None,
    max_batch_size: int = 64,
    max_batch_tokens: int = 4096,
    max_wait_ms: float = 5.0,
    max_queue: int = 1024,
    max_request_tokens: int = defaults.MAX_REQUEST_TOKENS,
    max_client_batch_size: int = defaults.MAX_CLIENT_BATCH_SIZE,
    auto_truncate: bool = False,
    payload_limit: int | None = None,
    api_key: str | None = None,
    max_connections: int | None = None,
    read_timeout: float | None = defaults.READ_TIMEOUT,
    **deployment_options: Any,
) -> serve.Application:
    """A Ray Serve application serving ``elmo-fast serve``'s API; ``serve.run(serve_app(...))`` deploys it.

    The model as ``embed`` takes it (``model``, ``model_dir`` + ``model_format``, ``options_file`` +
    ``weight_file``; none: the bundled model); ``device`` (None: the replica's GPU if Ray gave it one,
    else the CPU), ``backend``, ``precision``. The server's flags, as parameters: ``max_batch_size``,
    ``max_batch_tokens``, ``max_wait_ms``, ``max_queue``, ``max_request_tokens``, ``max_client_batch_size``,
    ``auto_truncate``, ``payload_limit``; the guards: ``api_key`` (None: each replica's
    ``ELMO_FAST_API_KEY`` if set), ``max_connections`` (requests in progress per replica: Ray's proxy
    holds the sockets, and its own settings bound them), ``read_timeout`` (seconds for a request's whole
    body).

    Every other keyword is the deployment's (``num_replicas``, ``autoscaling_config``,
    ``ray_actor_options``, ``max_ongoing_requests`` (default 256), ``max_queued_requests``, ``name``, ...).
    """
    limits = Limits(
        max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms, max_queue=max_queue
    )
    settings = ReplicaSettings(
        ModelChoice(model, model_dir, options_file, weight_file, model_format),
        device,
        backend,
        precision,
        limits,
        RequestLimits(
            max_request_tokens=max_request_tokens,
            max_client_batch_size=max_client_batch_size,
            payload_limit=payload_limit,
            auto_truncate=auto_truncate,
        ),
        api_key,
        max_connections,
        read_timeout,
    )
    deployment = ElmoDeployment.options(**deployment_options) if deployment_options else ElmoDeployment
    return deployment.bind(settings)
