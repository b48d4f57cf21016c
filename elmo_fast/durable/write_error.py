"""The one error of a failed write, and its wording: the final file and the OS error, on one line."""

from __future__ import annotations

import errno
import os
import re

from ..errors import ElmoFastError


class WriteError(ElmoFastError):
    """A file could not be written whole (disk full, I/O error, no permission, name too long).

    Nothing was left under its final name. The message names the file and the OS error."""

    def __init__(self, path: str | os.PathLike, cause: BaseException | str) -> None:
        self.path = os.fspath(path)
        self.errno = getattr(cause, "errno", None)
        super().__init__(f"cannot write {self.path}: {describe_os_error(cause)}")

    def __reduce__(self):
        return _rebuild_write_error, (str(self), self.path, self.errno, type(self))


class OutputPathError(WriteError):
    """A file cannot be written where it was asked for, found before any work: its folder missing or not a
    folder, the target itself a folder, its name too long for the filesystem, no permission to create files
    there. The caller's argument is wrong, as with any bad input (the command line exits 2 for it, and 1
    for a :class:`WriteError` during a run)."""


def _rebuild_write_error(message: str, path: str, err: int | None, cls: type = WriteError) -> WriteError:
    e = cls.__new__(cls)
    ElmoFastError.__init__(e, message)
    e.path, e.errno = path, err
    return e


def describe_os_error(cause: BaseException | str) -> str:
    """``No space left on device (ENOSPC)`` for an OSError, its text for anything else, on one line."""
    if isinstance(cause, str):
        return cause
    err = getattr(cause, "errno", None)
    if isinstance(cause, OSError) and err:
        name = errno.errorcode.get(err, str(err))
        return f"{os.strerror(err)} ({name})"
    text = " ".join(str(cause).split()) or type(cause).__name__
    # h5py and torch wrap the OS error in their own words; keep its name when they quote it
    found = re.search(r"errno\s*=?\s*(\d+)", text)
    if found and int(found.group(1)) in errno.errorcode:
        code = int(found.group(1))
        return f"{os.strerror(code)} ({errno.errorcode[code]}): {text}"
    return text
