"""HDF5 files written so that HDF5 never sees an I/O error (it does not recover from one).

HDF5 files are written through :class:`GuardedFile` (h5py's file-object driver): the first error is
recorded, the writer stops at its next check, and the file is thrown away
(:class:`~elmo_fast.durable.file_writers.Hdf5Writer`). :func:`close_hdf5` closes one so that an error
is an exception, never an "Exception ignored" from the garbage collector."""

from __future__ import annotations

import io
import os
from typing import Any

from .failures import unraisable_errors
from .write_error import WriteError


class GuardedFile(io.RawIOBase):
    """The file beneath an HDF5 file being written, which HDF5 reaches through h5py's file-object
    driver: HDF5 never sees an I/O error.

    HDF5 does not recover from a failed write: the file's objects then fail to close ("Exception
    ignored ... Can't decrement id ref count"), and the library's state is left unsafe, so that the
    next file the process writes can crash it (seen with HDF5 1.14 and 2.0). So the first OSError
    of a write, truncate or read is recorded here instead (:attr:`error`) and the call reports
    success; later writes go to memory, where reads find them, so HDF5's view of its file stays
    consistent while the writer stops at its next :meth:`check` and the file is thrown away.
    Writes and reads use ``pwrite``/``pread`` at a position kept here.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._pos = 0
        self._end = 0  # the file's logical size, as HDF5 has made it
        #: the first OSError of a write, read or truncate, if any
        self.error: OSError | None = None
        self._memory: list[tuple[int, bytes]] = []  # (offset, bytes) written after the error

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._end}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if self.error is None:
            try:
                done = 0
                while done < n:
                    done += os.pwrite(self._fd, view[done:], self._pos + done)
            except OSError as e:
                self.error = e
        if self.error is not None:
            self._memory.append((self._pos, bytes(view)))
        self._pos += n
        self._end = max(self._end, self._pos)
        return n

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), max(0, self._end - self._pos))
        got = 0
        if n:
            try:
                got = os.preadv(self._fd, [view[:n]], self._pos)
            except OSError as e:
                self.error = self.error or e
            view[got:n] = bytes(n - got)  # a hole or a short file reads as zeros, as on disk
        for offset, data in self._memory:  # what went to memory overrides the file, in order
            lo, hi = max(offset, self._pos), min(offset + len(data), self._pos + n)
            if lo < hi:
                view[lo - self._pos : hi - self._pos] = data[lo - offset : hi - offset]
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self._fd, size)
            except OSError as e:
                self.error = e
        self._end = size
        return size

    def flush(self) -> None:
        pass

    def check(self, path: str | os.PathLike) -> None:
        """Raise :class:`WriteError` for ``path`` if a write failed."""
        if self.error is not None:
            raise WriteError(path, self.error)


def close_hdf5(f: Any) -> None:
    """Flush and close an open ``h5py.File`` so that an error is an exception here, never an
    "Exception ignored" from the garbage collector later. h5py's close closes every object of the
    file still open (datasets or groups referenced elsewhere included), so nothing of the file is
    left for the collector to close; no ``gc.collect()`` (0.15 s with torch loaded, per file)."""
    with unraisable_errors() as late:
        f.flush()
        f.close()
    if late:
        raise late[0]
