"""One run per output: the :class:`~elmo_fast.run_lock.RunLock` an ``embed_file`` run holds from its
first check to its last rename.

Two runs writing one output (two ``--resume`` runs taking each other's shards for their own, or a
plain run renaming its file over a resumable run's) would destroy each other's work. The lock is
``.OUTPUT.elmo-lock`` beside the output: the same name for every run on that output, plain or
resumable, whatever its work area; not a temporary file (nothing sweeps it) and not an output. It
is removed when the run ends; a killed run's stays, and never blocks the next run.

The command line takes it before it loads the model, so that a second run fails at once; the
library takes it again for ``embed_file``: in the thread that holds it already, that is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from ..durable import fitting_stem
from ..run_lock import RunLock

LOCK_SUFFIX = ".elmo-lock"

_held: dict[str, tuple[int, int]] = {}  # lock path -> (holding thread, depth)
_guard = threading.Lock()


def lock_path(output: str | os.PathLike) -> str:
    """The lock file of ``output``: ``.NAME.elmo-lock`` in its folder (NAME shortened for a name too
    long to leave room for the rest: :func:`elmo_fast.durable.fitting_stem`)."""
    directory, base = os.path.split(os.path.abspath(os.fspath(output)))
    return os.path.join(directory, f".{fitting_stem(base, 1 + len(LOCK_SUFFIX))}{LOCK_SUFFIX}")


@contextlib.contextmanager
def hold_output(output: str | os.PathLike) -> Iterator[None]:
    """Hold ``output``'s lock for the block; :class:`~elmo_fast.run_lock.RunLocked` (an
    ElmoFastError naming the holder's PID) at once if another run holds it. Re-entrant in the
    thread that holds it; another thread of this process is another run."""
    path = lock_path(output)
    me = threading.get_ident()
    with _guard:
        owner, depth = _held.get(path, (None, 0))
        if owner == me:
            _held[path] = (me, depth + 1)
            lock = None
        else:
            lock = RunLock(path, f"output {os.path.abspath(os.fspath(output))}", remove=True).acquire()
            _held[path] = (me, 1)
    try:
        yield
    finally:
        with _guard:
            owner, depth = _held[path]
            if depth > 1:
                _held[path] = (owner, depth - 1)
            else:
                del _held[path]
                if lock is not None:
                    lock.release()
