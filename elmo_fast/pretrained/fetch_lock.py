"""One fetch per model at a time, across processes: Ray actors, torchrun ranks or two shells fetching
the same model download it once; the others wait, then find it in the cache.

The lock is :class:`~elmo_fast.run_lock.RunLock` (an flock: a killed holder never blocks) on
``<cache>/locks/<key>.lock``, taken in waiting mode; a process that waits says so in one line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..errors import DownloadError
from ..run_lock import RunLock, RunLocked


def _file_key(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key)[:200]


class FetchLock:
    """``with FetchLock(cache, key, what):`` holds the fetch lock of model ``key`` for the block."""

    def __init__(self, cache: Path, key: str, what: str, *, quiet: bool = False) -> None:
        self.path = cache / "locks" / f"{_file_key(key)}.lock"
        self.what = what
        self.quiet = quiet
        self._lock: RunLock | None = None

    def _waiting(self, holder: str) -> None:
        if not self.quiet:
            print(f"elmo-fast: {self.what} is being fetched by {holder}; waiting for it", file=sys.stderr)

    def __enter__(self) -> FetchLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = RunLock(self.path, self.what, wait=self._waiting).acquire()
        except (OSError, RunLocked) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else e
            raise DownloadError(f"cannot fetch {self.what}: cannot lock {self.path}: {reason}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
