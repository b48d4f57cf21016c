"""Slow clients against a server, as one asyncio process (run by tests/serve/test_serve_exposed.py):

    python slow_clients.py HOST PORT N KEY

opens N connections of each kind, all within RAMP seconds:

* ``silent``: connects and sends nothing;
* ``trickle``: sends a request's head (Content-Length 100000), then its body a byte a second;
* ``stall_next``: sends one whole request (GET /health), reads its answer, then the start of a second
  request's head, and nothing more;

and waits for the server to close each. Prints ``attacking`` once every connection is open, then one
line of JSON: per kind, how many were closed, the longest time from a client's last step (connected;
head sent; the second head started) to its connection's close, and the errors seen."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time

GIVE_UP = 60.0
RAMP = 1.5


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Until the server closes the connection (a reset counts: the server closed it on unread bytes)."""
    try:
        while await reader.read(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass


async def silent(host, port, key, opened):
    reader, writer = await asyncio.open_connection(host, port)
    opened()
    start = time.monotonic()
    await asyncio.wait_for(_until_closed(reader), GIVE_UP)
    writer.close()
    return time.monotonic() - start


async def trickle(host, port, key, opened):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        (
            f"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n{"
        ).encode()
    )
    await writer.drain()
    opened()
    start = time.monotonic()
    closed = asyncio.ensure_future(_until_closed(reader))
    closed.add_done_callback(lambda _: ended.append(time.monotonic()))
    ended: list[float] = []
    try:
        while not closed.done() and time.monotonic() - start < GIVE_UP:
            await asyncio.sleep(1.0)
            if not closed.done():
                writer.write(b" ")
    except (ConnectionError, OSError):  # the server closed it while this client wrote
        pass
    await asyncio.wait_for(closed, max(0.1, GIVE_UP - (time.monotonic() - start)))
    writer.close()
    return ended[0] - start


async def stall_next(host, port, key, opened):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    await reader.readexactly(length)
    assert head.startswith(b"HTTP/1.1 200"), head
    writer.write(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Le")
    await writer.drain()
    opened()
    start = time.monotonic()
    await asyncio.wait_for(_until_closed(reader), GIVE_UP)
    writer.close()
    return time.monotonic() - start


async def main(host: str, port: int, n: int, key: str) -> dict:
    kinds = {"silent": silent, "trickle": trickle, "stall_next": stall_next}
    total = n * len(kinds)
    count = 0

    def opened() -> None:
        nonlocal count
        count += 1
        if count == total:
            print("attacking", flush=True)

    async def later(delay: float, fn):
        await asyncio.sleep(delay)
        return await fn(host, port, key, opened)

    # every connection opened within RAMP seconds, the kinds interleaved
    tasks = {
        kind: [asyncio.ensure_future(later(RAMP * (i * len(kinds) + k) / total, fn)) for i in range(n)]
        for k, (kind, fn) in enumerate(kinds.items())
    }
    report = {}
    for kind, futures in tasks.items():
        results = await asyncio.gather(*futures, return_exceptions=True)
        times = [r for r in results if isinstance(r, float)]
        errors = sorted({f"{type(r).__name__}: {r}" for r in results if not isinstance(r, float)})
        report[kind] = {"closed": len(times), "longest": max(times, default=None), "errors": errors[:5]}
    return report


if __name__ == "__main__":
    # a client on another machine takes none of the server's CPU: on one machine, it yields to the server
    os.nice(5)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port, n, key = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    try:
        import uvloop  # the [serve] extra's uvicorn uses it where installed: the cheaper loop for 1,800 sockets

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main(host, port, n, key))), flush=True)
