"""One run per target: an advisory lock held for the whole of a run.

Two ``embed --resume`` runs on one output, or two ``train`` runs on one save folder, would each
take the other's finished parts for their own and overwrite them. Every command that builds a
target over many steps holds :class:`RunLock` on a lock file beside (or inside) it for as long as
it runs; a second run on the same target fails at once with a message naming the holder.

The lock is ``fcntl.flock`` on a file that is never removed, so it lives exactly as long as the
holder's open file description: the kernel drops it when the holder exits, however it exits
(kill -9 included). A lock file left behind by a killed run therefore never blocks anyone; its
content (who held it last) is only used to word the message. The file is created in place, not
through :mod:`elmo_fast.durable`: it is not an output, and a lock must stay the same inode for
every run that opens it (a renamed-into-place file would give two runs two different locks).

``flock`` is per open file description, so one process opening the same lock twice also sees it
taken: a run cannot be nested inside another run on the same target, in one process or two.

A lock beside an output (``remove=True``) is removed when its run ends, so that it does not stay
beside every output as litter. That is safe because whoever takes the lock checks, once it holds
it, that the name still leads to the inode it locked: a run that opened the file just before the
holder removed it finds the name gone (or a new file under it) and tries again. A killed run's
file stays, and never blocks: the next run takes it and removes it in turn.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from .errors import ElmoFastError
from .host import host_name

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no flock, so no lock (every command runs as before)
    fcntl = None  # type: ignore[assignment]


class RunLocked(ElmoFastError):
    """Another run holds the target's lock."""


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
        return f"PID {int(holder['pid'])} on {holder['host']}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not yet written its PID"


class RunLock:
    """``with RunLock(path, what):`` holds an exclusive lock on ``path`` for the block.

    ``what`` names the target in the message (``"output /data/x.hdf5"``). The lock file's folder
    must exist. ``remove``: remove the lock file when the lock is released (see the module's
    docstring); without it the file stays for the next run. Raises :class:`RunLocked` at once if
    another run holds it (no waiting: a second run that waited would redo or undo the first one's
    work when it got its turn). Where there is no ``fcntl`` (not POSIX), it holds nothing.

    ``wait``: a callable instead, for work that a second process must not redo but may use once done
    (a download into the cache): it is called once with the holder's description, then the lock is
    waited for.
    """

    def __init__(
        self, path: str | os.PathLike, what: str, *, remove: bool = False, wait: Callable[[str], None] | None = None
    ):
        self.path = Path(path)
        self.what = what
        self.remove = remove
        self.wait = wait
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: this RunLock is already held")
        if fcntl is None:
            return self
        while True:
            fd = self._lock_once()
            if fd is not None:
                break
        self._fd = fd
        return self

    def _same_file(self, fd: int) -> bool:
        """Whether the lock's name still leads to the file locked through ``fd`` (a holder that
        removes its lock file may have removed it between our open and our flock)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _lock_once(self) -> int | None:
        """The locked descriptor; None: the file was replaced meanwhile, try again."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RunLocked(f"{self.what}: cannot open the lock file {self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if self.wait is not None:
                return self._wait_for(fd)
            try:
                holder = _describe_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            finally:
                os.close(fd)
            raise RunLocked(
                f"{self.what} is in use by another elmo-fast run ({holder}); wait for it "
                f"to end or stop it (lock file {self.path})"
            ) from None
        except OSError as e:  # a filesystem without flock (some network mounts): say so, do not guess
            os.close(fd)
            raise RunLocked(f"{self.what}: cannot lock {self.path}: {e.strerror or e}") from None
        return self._claim(fd)

    def _wait_for(self, fd: int) -> int | None:
        """``fd`` locked once its holder lets go (``wait`` told of the holder first)."""
        try:
            self.wait(_describe_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace")))
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return self._claim(fd)

    def _claim(self, fd: int) -> int | None:
        """``fd`` (locked) with this process written in it; None: the file was replaced meanwhile."""
        if not self._same_file(fd):
            os.close(fd)
            return None
        # Who holds it, for the next run's message only: a torn or failed write here costs nothing
        # but the wording of that message, so it is neither checked nor synced.
        record = json.dumps({"pid": os.getpid(), "host": host_name(), "since": time.time()}).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except OSError:
            pass
        return fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if self.remove:  # while still held: whoever opened it meanwhile sees the name gone and retries
                try:
                    os.unlink(self.path)
                except OSError:
                    pass  # a lock file that stays costs nothing but its name
            try:
                os.close(fd)  # closing the only descriptor drops the flock
            except OSError:  # Linux frees the descriptor (and the lock) whatever close reports
                pass

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
