"""One-shot writes: a ``with`` block that writes one file, whole under its final name when the
block ends cleanly, nothing at all when it does not."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from .commit_steps import commit, remove_quietly
from .failures import aborting, unraisable_errors
from .file_writers import FileWriter, Hdf5Writer
from .temp_names import temp_path

#: what a failure inside a block is reported as (a WriteError naming the final file): the OS's
#: errors, and the libraries' (h5py's and torch's RuntimeError, a buffer that could not be allocated)
_WRITE_FAILURES = (OSError, RuntimeError, MemoryError)


@contextlib.contextmanager
def durable_path(
    final: str | os.PathLike, *, check: Callable[[str], None] | None = None, sync: bool = True
) -> Iterator[str]:
    """Yield a temporary path beside ``final``; the body writes a whole file there and closes it.
    On a clean exit the file is checked (``check(temp)``, optional), fsync'ed and renamed onto
    ``final``. Any error removes it and raises :class:`WriteError` (an :class:`ElmoFastError` raised by
    the body, and KeyboardInterrupt/SystemExit, pass through unchanged, after the cleanup).
    ``sync=False``: see :func:`commit`."""
    final = os.path.abspath(os.fspath(final))
    temp = temp_path(final)
    with aborting(final, lambda: remove_quietly(temp), _WRITE_FAILURES):
        with unraisable_errors() as late:
            yield temp
            if late:
                raise late[0]
        if not os.path.exists(temp):
            raise FileNotFoundError(errno.ENOENT, "the writer created no file", temp)
        if check is not None:
            check(temp)
        commit(temp, final, sync)


@contextlib.contextmanager
def durable_open(
    final: str | os.PathLike,
    mode: str = "w",
    encoding: str | None = "utf-8",
    newline: str | None = None,
    sync: bool = True,
) -> Iterator[IO]:
    """A new file object ("w" text or "wb" bytes) under a temporary name, flushed, fsync'ed, closed
    and renamed onto ``final`` when the block ends cleanly (a :class:`FileWriter` for the block)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"durable_open writes new files: mode 'w' or 'wb', not {mode!r}")
    writer = FileWriter(final, mode, encoding=encoding, newline=newline, sync=sync)
    with aborting(writer.final, writer.abort, _WRITE_FAILURES):
        with unraisable_errors() as late:
            yield writer.file
            if late:
                raise late[0]
    writer.finish()


@contextlib.contextmanager
def durable_hdf5(final: str | os.PathLike, **h5py_kwargs: Any) -> Iterator[Any]:
    """A new ``h5py.File`` under a temporary name (:class:`Hdf5Writer`); on a clean exit every object
    in it is closed, the write checked, the file fsync'ed and renamed onto ``final``."""
    writer = Hdf5Writer(final, **h5py_kwargs)
    with aborting(writer.final, writer.abort, ()):
        yield writer.file
    writer.finish()


@contextlib.contextmanager
def scratch_dir(prefix: str = "elmo-fast-") -> Iterator[str]:
    """A private temporary folder (in the system's temporary area) for files that are never outputs,
    such as a model written only to be read back: removed with its content on leaving the block,
    however it is left. Outputs never pass through it: they are written beside their final name."""
    with tempfile.TemporaryDirectory(prefix=prefix) as directory:
        yield directory
