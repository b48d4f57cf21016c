"""elmo-fast on Ray (the ``[ray]`` extra: ``pip install "elmo-fast[ray]"``): the core's embedder as a
Ray Data batch function, and ``elmo-fast serve``'s app as a Ray Serve deployment.

* :mod:`~elmo_fast.ray.model_choice`    the model as ``embed`` takes it (a name, a directory, files, or
                                        the bundled one), loaded into an :class:`~elmo_fast.ElmoEmbedder`
* :mod:`~elmo_fast.ray.actor_resources` the device and the CPU threads of a Ray actor, from what Ray gave it
* :mod:`~elmo_fast.ray.rows`            a Ray Data batch's column read into sentences, each bad row an
                                        error naming it
* :mod:`~elmo_fast.ray.batch_embedder`  :class:`ElmoBatchEmbedder`, for ``Dataset.map_batches``
* :mod:`~elmo_fast.ray.replica_settings` what each Ray Serve replica is told (model, limits, guards), checked once
* :mod:`~elmo_fast.ray.until_warm`      a replica's app starts once its model is warm
* :mod:`~elmo_fast.ray.serve_deployment` :func:`serve_app` / :class:`ElmoDeployment`: ``elmo-fast serve``'s app
                                        (:mod:`elmo_fast.serve`) in each replica of a Ray Serve application

This room imports the core and never the other way round: nothing else in the package imports it, and
``import elmo_fast`` (or ``import elmo_fast.ray``) imports neither Ray nor torch. Names are loaded on
first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ElmoBatchEmbedder": "elmo_fast.ray.batch_embedder",
    "ElmoDeployment": "elmo_fast.ray.serve_deployment",
    "serve_app": "elmo_fast.ray.serve_deployment",
}

__all__ = ["ElmoBatchEmbedder", "ElmoDeployment", "serve_app"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elmo_fast.ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
