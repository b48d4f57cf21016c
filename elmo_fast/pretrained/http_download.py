"""One file over HTTP(S) into the cache: streamed through the durable write path (a temporary name
beside the file, renamed once whole), its size and SHA-256 computed as it arrives.

A response shorter than its Content-Length, a lost connection, an HTTP error or a digest that does
not match the pin asked for is a :class:`DownloadError` and leaves nothing under the file's name.
"""

from __future__ import annotations

import hashlib
import http.client
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..durable import WriteError, durable_open
from ..errors import DownloadError

_CHUNK_SIZE = 1 << 16
_USER_AGENT = "elmo-fast"


@dataclass(frozen=True)
class Received:
    """What a download wrote: its size in bytes and SHA-256 (hex)."""

    size: int
    sha256: str


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def download(
    url: str,
    path: Path,
    what: str,
    *,
    progress: bool,
    timeout: float,
    offline_hint: str,
    expected_sha256: str | None = None,
    refetch: str = "",
    bar: str | None = None,
) -> Received:
    """Download ``url`` to ``path`` (see the module's docstring). ``what`` names the model in messages
    (``bar``, default ``what``, the progress bar: ``bar/<file name>``); ``offline_hint`` ends the message of a network failure;
    ``expected_sha256``: the pin the file must match (``refetch``: what to say when it does not)."""

    def network_error(reason: object) -> DownloadError:
        return DownloadError(f"cannot download {what} from {url}: {reason}. {offline_hint}")

    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DownloadError(f"cannot download {what} from {url}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, OSError):
            raise network_error(_describe(exc.reason)) from exc
        raise DownloadError(f"cannot download {what} from {url}: {exc.reason}") from exc
    except (OSError, http.client.HTTPException) as exc:  # timeout, reset, bad status line
        raise network_error(_describe(exc)) from exc

    digest = hashlib.sha256()
    received = 0
    try:
        # through the one durable write path: a temporary name beside the file, renamed once whole
        with response, durable_open(path, "wb") as out:
            length_header = response.headers.get("Content-Length")
            try:
                expected = int(length_header) if length_header is not None else None
            except ValueError:
                expected = None
            with tqdm(
                total=expected,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"{bar or what}/{path.name}",
                file=sys.stderr,
                disable=not progress,
                leave=True,
            ) as bar:
                while True:
                    try:
                        chunk = response.read(_CHUNK_SIZE)
                    except http.client.IncompleteRead as exc:
                        received += len(exc.partial)
                        raise DownloadError(
                            f"cannot download {what} from {url}: incomplete response ({received} of {expected} bytes)"
                        ) from exc
                    except (OSError, http.client.HTTPException) as exc:
                        raise network_error(f"connection lost after {received} bytes ({_describe(exc)})") from exc
                    if not chunk:
                        break
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            if expected is not None and received != expected:
                raise DownloadError(
                    f"cannot download {what} from {url}: incomplete response "
                    f"(received {received} of {expected} bytes announced by Content-Length)"
                )
            found = digest.hexdigest()
            if expected_sha256 is not None and found != expected_sha256:  # raised inside: nothing is renamed
                raise DownloadError(
                    f"{url}: SHA-256 {found} does not match the pin {expected_sha256} ({received} bytes received, "
                    f"not kept); check the pin{refetch}"
                )
    except WriteError as exc:
        # a local problem (disk full, permissions) while writing the cache, not the network's
        raise DownloadError(f"cannot download {what} from {url}: {exc}") from exc
    return Received(received, found)
