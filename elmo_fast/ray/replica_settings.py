"""What every replica of the Ray Serve app is told, checked once on the driver (a bad value is a
one-line error naming the parameter before anything is deployed): the model (:mod:`.model_choice`),
its device, backend and precision, the dynamic batcher's limits and the guards, all as
``elmo-fast serve`` takes them as flags."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import ElmoFastError, Param
from ..serve.batcher import Limits
from ..serve.protocol import RequestLimits
from .model_choice import ModelChoice

#: the API key's variable, as ``elmo-fast serve`` reads it; here in each replica's environment
API_KEY_ENV = "ELMO_FAST_API_KEY"


@dataclass(frozen=True)
class ReplicaSettings:
    """``api_key`` None: the replica's ``ELMO_FAST_API_KEY``, if set (so that the key need not travel in
    the deployment's arguments); no key at all: none needed; never in a repr. ``device`` None: the GPU
    Ray gave the replica (``ray_actor_options={"num_gpus": 1}``), else the CPU. ``max_connections``:
    requests in progress in one replica (Ray's proxy holds the sockets)."""

    model: ModelChoice = field(default_factory=ModelChoice)
    device: str | None = None
    backend: str = "auto"
    precision: str | None = None
    limits: Limits = field(default_factory=Limits)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    api_key: str | None = field(default=None, repr=False)
    max_connections: int | None = None
    read_timeout: float | None = 30.0

    def __post_init__(self) -> None:
        from ..bilm.precision import resolve_precision

        for name in ("max_batch_size", "max_batch_tokens", "max_queue"):
            _at_least_one(name, getattr(self.limits, name))
        _at_least_one("max_request_tokens", self.request_limits.max_request_tokens)
        _at_least_one("max_client_batch_size", self.request_limits.max_client_batch_size)
        if self.request_limits.payload_limit is not None:
            _at_least_one("payload_limit", self.request_limits.payload_limit)
        if self.limits.max_wait_ms < 0:
            raise ElmoFastError(Param("max_wait_ms"), f" must be >= 0, got {self.limits.max_wait_ms:g}")
        if self.api_key is not None and not self.api_key.strip():
            raise ElmoFastError(
                Param("api_key"), f" is empty: give a key, or leave it None (then the replicas' {API_KEY_ENV}, if set)"
            )
        if self.max_connections is not None:
            _at_least_one("max_connections", self.max_connections)
        if self.read_timeout is not None and not self.read_timeout > 0:
            raise ElmoFastError(Param("read_timeout"), f" must be > 0 seconds or None, got {self.read_timeout!r}")
        if self.backend not in ("auto", "fast", "reference"):
            raise ElmoFastError(Param("backend"), f" must be 'auto', 'fast' or 'reference', got {self.backend!r}")
        resolve_precision(self.precision)  # a name it knows (the device is checked on the replica)

    def key(self) -> str | None:
        """The API key the replica requires (None: none)."""
        key = self.api_key if self.api_key is not None else os.environ.get(API_KEY_ENV)
        return key.strip() if key and key.strip() else None


def _at_least_one(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ElmoFastError(Param(name), f" must be an integer >= 1, got {value!r}")
