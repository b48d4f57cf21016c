"""Several files that make one whole (a model's options and weights), renamed only when all are whole."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO, Any

from .commit_steps import fsync_dir
from .file_writers import FileWriter, Hdf5Writer, rename_sealed
from .write_error import WriteError


class FileSet:
    """The files of one :func:`together` block: :meth:`open` and :meth:`hdf5` each begin one."""

    def __init__(self) -> None:
        self.writers: list[Hdf5Writer | FileWriter] = []

    def open(self, final: str | os.PathLike, mode: str = "w", **kwargs: Any) -> IO:
        """A new text ("w") or binary ("wb") file that becomes ``final`` with the others."""
        self.writers.append(FileWriter(final, mode, **kwargs))
        return self.writers[-1].file  # type: ignore[return-value]

    def hdf5(self, final: str | os.PathLike, **h5py_kwargs: Any) -> Any:
        """A new ``h5py.File`` that becomes ``final`` with the others."""
        self.writers.append(Hdf5Writer(final, **h5py_kwargs))
        return self.writers[-1].file

    def abort(self) -> None:
        for writer in self.writers:
            writer.abort()


@contextlib.contextmanager
def together() -> Iterator[FileSet]:
    """Several files that make one whole (a model's options and weights), written so that a failure
    changes none of their final names: each is written under its temporary name, and only when every
    one is sealed (closed, checked, fsync'ed) are they renamed, in the order they were begun, and
    their folders fsync'ed once. A failure after the renames (the folder's fsync) leaves every new
    file whole in place, and is still an error (the renames may not survive a power loss)::

        with together() as files:
            json.dump(options, files.open(folder / "options.json"))
            files.hdf5(folder / "weights.hdf5").create_dataset(...)
    """
    files = FileSet()
    try:
        yield files
        for writer in files.writers:
            writer.seal()
    except BaseException:
        files.abort()
        raise
    for writer in files.writers:
        rename_sealed(writer, sync_dir=False)
    for directory in sorted({os.path.dirname(w.final) for w in files.writers}):
        try:
            fsync_dir(directory)
        except OSError as e:
            raise WriteError(files.writers[-1].final, e) from e
