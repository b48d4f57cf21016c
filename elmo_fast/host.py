"""This machine's name, as the package shows it (a lock's holder, a rank's host) and as temporary
names hold it: one owner, so that every place that names a host names it alike."""

from __future__ import annotations

import socket


def host_name() -> str:
    """The host's name (``socket.gethostname()``), ``"?"`` where it has none."""
    return socket.gethostname() or "?"
