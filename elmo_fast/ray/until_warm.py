"""An ASGI wrapper whose lifespan startup completes only once the model is loaded and warm, or has
failed: a Ray Serve replica counts as started when its app's startup completes (and its first health
check passes), and Ray then sends it requests; ``elmo-fast serve`` answers 503 until warm instead,
behind its listening socket. A model that failed is reported by the replica's health check
(:meth:`~.serve_deployment.ElmoDeployment.check_health`), whose error Ray shows in the deployment's
status."""

from __future__ import annotations

import asyncio

from ..serve.guards import ASGIApp


def until_warm(app: ASGIApp, settled: asyncio.Event) -> ASGIApp:
    """``app``, whose ``lifespan.startup.complete`` waits for ``settled`` (the model is warm, or failed)."""

    async def wrapped(scope: dict, receive, send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_once_settled(message: dict) -> None:
            if message["type"] == "lifespan.startup.complete":
                await settled.wait()
            await send(message)

        await app(scope, receive, send_once_settled)

    return wrapped
