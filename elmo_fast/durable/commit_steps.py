"""The last steps of every write: fsync the file, give it a normal file's mode, rename it onto its
final name, fsync the folder (the rename itself is then on disk)."""

from __future__ import annotations

import contextlib
import errno
import os

from .write_error import WriteError


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file by name (raises OSError)."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a folder, so that a rename or a new name in it is on disk. Filesystems that cannot
    fsync a folder (EINVAL, and Windows) are let be: the rename is as durable as they make it."""
    if os.name != "posix":
        return
    fd = os.open(os.fspath(directory) or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def normal_mode(path: str) -> None:
    """Give a file made with O_EXCL's private mode a normal file's mode (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def remove_quietly(*paths: str | os.PathLike | None) -> None:
    for p in paths:
        if p:
            with contextlib.suppress(OSError):
                os.unlink(p)


def commit(temp: str | os.PathLike, final: str | os.PathLike, sync: bool = True) -> None:
    """fsync ``temp`` (written and closed), give it a normal file's mode, rename it onto ``final``,
    fsync the folder. For writers that manage their own temporary file; raises OSError.
    ``sync=False`` skips both fsyncs: the rename is still atomic (readers see the old file or the
    new one), but a power loss may lose it; only for advisory files rewritten every second."""
    temp, final = os.fspath(temp), os.fspath(final)
    if sync:
        fsync_path(temp)
    normal_mode(temp)
    os.replace(temp, final)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(final)))


def move(path: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename a file that is whole on disk already (written through this package) onto ``final`` and
    fsync ``final``'s folder: the last step of a two-phase write, such as a resumable run's output,
    recorded as complete under a name of its own before it takes its final name. Both names must be
    on one filesystem. Raises :class:`WriteError` naming ``final``; the file stays where it was."""
    try:
        os.replace(os.fspath(path), os.fspath(final))
        fsync_dir(os.path.dirname(os.path.abspath(final)))
    except OSError as e:
        raise WriteError(final, e) from e
