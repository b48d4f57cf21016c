"""The long-lived writers: a new file open for as long as its writer needs, whole under its final
name at :meth:`finish` or nothing at all after :meth:`abort`.

:class:`FileWriter` (text or bytes) and :class:`Hdf5Writer` (an ``h5py.File``) follow the same
steps: write under a temporary name beside ``final``; :meth:`seal` (flush, check, fsync, close);
:func:`rename_sealed` (rename onto ``final``, fsync the folder). Every step goes through
:func:`~elmo_fast.durable.failures.aborting`: a failure throws the temporary file away and raises a
:class:`~elmo_fast.durable.WriteError` naming ``final``."""

from __future__ import annotations

import contextlib
import os
from typing import IO, Any

from .commit_steps import commit, normal_mode, remove_quietly
from .failures import aborting
from .hdf5_guard import GuardedFile, close_hdf5
from .temp_names import temp_path

#: The file opener of FileWriter (tests swap it for one that fails the Nth write).
_open = open


class FileWriter:
    """A new text ("w") or binary ("wb") file written durably, open for as long as its writer needs:
    :class:`Hdf5Writer`'s twin for plain files. ``file`` is the file object (under a temporary name
    beside ``final``); :meth:`finish` flushes, fsyncs, closes and renames it onto ``final``;
    :meth:`abort` throws it away. ``tag`` tells apart several temporary files of one final name, such
    as a scratch file that only serves the writer of ``final`` and is aborted once used: a killed
    run's is swept like any temporary file. ``sync=False``: see :func:`~elmo_fast.durable.commit`."""

    def __init__(
        self,
        final: str | os.PathLike,
        mode: str = "w",
        encoding: str | None = "utf-8",
        newline: str | None = None,
        tag: str | None = None,
        sync: bool = True,
    ) -> None:
        if mode not in ("w", "wb"):
            raise ValueError(f"a FileWriter writes a new file: mode 'w' or 'wb', not {mode!r}")
        self.final = os.path.abspath(os.fspath(final))
        self.temp = temp_path(self.final, tag)
        self.sync = sync
        self.file: IO | None = None
        binary = mode == "wb"
        with aborting(self.final, self.abort):
            self.file = _open(
                self.temp,
                "xb" if binary else "x",
                encoding=None if binary else encoding,
                newline=None if binary else newline,
            )

    def write(self, data) -> int:
        """``file.write(data)``; an OSError (a full disk) is a :class:`WriteError` naming the final file."""
        with aborting(self.final, lambda: None):
            return self.file.write(data)

    def close(self) -> str:
        """Close a scratch file that is read back, never finished, with its errors checked (a close
        that fails may have lost what was buffered): a :class:`WriteError` naming the final file.
        Returns its path; :meth:`abort` removes it."""
        f, self.file = self.file, None
        if f is not None:
            with aborting(self.final, lambda: None):
                f.close()
        return self.temp

    def finish(self) -> None:
        self.seal()
        rename_sealed(self)

    def seal(self) -> None:
        """Flush, fsync and close: the temporary file is whole on disk, not yet renamed."""
        with aborting(self.final, self.abort):
            f, self.file = self.file, None
            try:
                f.flush()
                if self.sync:
                    os.fsync(f.fileno())
            finally:
                f.close()  # a close that fails raises here: the write is then an error, not an output

    def abort(self) -> None:
        if self.file is not None:
            with contextlib.suppress(Exception):
                self.file.close()
            self.file = None
        remove_quietly(self.temp)


class Hdf5Writer:
    """A new HDF5 file written durably, open for as long as its writer needs: ``file`` is the
    ``h5py.File`` (under a temporary name beside ``final``); :meth:`check` raises as soon as a write
    has failed (call it between batches: a full disk stops the work at once); :meth:`finish` closes
    every object, checks, fsyncs, closes and renames onto ``final``; :meth:`abort` throws it away.
    Either leaves nothing behind but a whole file under ``final`` or nothing at all."""

    sync = True

    def __init__(self, final: str | os.PathLike, **h5py_kwargs: Any) -> None:
        import h5py

        self.final = os.path.abspath(os.fspath(final))
        self.temp = temp_path(self.final)
        self._fd: int | None = None
        self.file = None
        with aborting(self.final, self.abort):
            self._fd = os.open(self.temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            self._guard = GuardedFile(self._fd)
            self.file = h5py.File(self._guard, "w", **h5py_kwargs)
            self.check()

    @property
    def failed(self) -> bool:
        return self._guard.error is not None

    def check(self) -> None:
        self._guard.check(self.final)

    def finish(self) -> None:
        self.seal()
        rename_sealed(self)

    def seal(self) -> None:
        """Close every object, check, fsync and close: the temporary file is whole on disk, not yet
        renamed (:func:`~elmo_fast.durable.together` renames several sealed files at once)."""
        with aborting(self.final, self.abort, (OSError, RuntimeError)):
            close_hdf5(self.file)
            self.check()
            os.fsync(self._fd)  # on the descriptor that wrote: a new one may not see a writeback error
            fd, self._fd = self._fd, None
            os.close(fd)

    def abort(self) -> None:
        if self.file is not None:
            with contextlib.suppress(Exception):
                if self.file.id.valid:
                    self.file.close()
            self.file = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        remove_quietly(self.temp)


def rename_sealed(writer: Hdf5Writer | FileWriter, sync_dir: bool = True) -> None:
    """The last step for a sealed writer's file (whole, and fsync'ed unless ``writer.sync`` is off):
    :func:`~elmo_fast.durable.commit`; ``sync_dir=False`` only gives it its mode and renames it
    (:func:`~elmo_fast.durable.together` fsyncs the folders once, after all)."""
    with aborting(writer.final, writer.abort):
        if sync_dir:
            commit(writer.temp, writer.final, writer.sync)
        else:
            normal_mode(writer.temp)
            os.replace(writer.temp, writer.final)
