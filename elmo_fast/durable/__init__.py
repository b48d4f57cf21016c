"""Durable writes: the one way elmo-fast puts a file under its final name.

Every file the package creates (embed outputs and their work area, random and converted models,
training checkpoints, exported weights, vocabularies, metrics) is written here, the way SQLite's and
HDF5's guidance on durable writes and Hugging Face datasets' cache writes do it:

1. the bytes go to a temporary name in the target's own folder (so the rename cannot cross devices),
   ``.NAME.HOST-PID.TOKEN.elmo-tmp``, created exclusively with a normal file's mode;
2. the writer is flushed and closed with every error checked, including the ones h5py reports only
   when it closes a file and torch only when it flushes one;
3. the file is ``fsync``'ed, renamed onto its final name, and the folder ``fsync``'ed (the rename
   itself is then on disk).

A failure at any step removes the temporary file, renames nothing, and raises :class:`WriteError`,
one line naming the final file and the OS error. So a file under its final name is whole: readers
see the old file or the complete new one, whatever moment a run is killed or a disk fills.

HDF5 files are written through :class:`GuardedFile` (h5py's file-object driver): HDF5 itself never
sees an I/O error, because it does not recover from one (its objects then fail to close, and the
next file the process writes can crash it); the first error is recorded, the writer stops at its
next check, and the file is thrown away (:class:`Hdf5Writer`).

The host and process in a temporary name let a later run tell a killed run's leftovers from a live
run's files (:func:`sweep_temp_files`).

Usage::

    with durable_open("vocab.txt", "w") as f:          # text or bytes
        f.write(...)
    with durable_hdf5("out.hdf5") as h5:               # an h5py.File
        h5.create_dataset(...)
    writer = Hdf5Writer("out.hdf5")                    # open across batches: writer.file, .check(),
    ...; writer.finish()  (or writer.abort())          # .finish() / .abort()
    with durable_path("model.pt") as tmp:              # any library that writes to a path
        some_library.save(tmp)
    write_json("manifest.json", {...}); save_torch(obj, "ckpt.pt")
    writer = FileWriter("list.txt", tag="sentences")   # a text file open across batches, the same way;
    ...; writer.abort()                                # a scratch file that only serves its writer
    move("work/assembled.h5", "out.h5")                # the last step of a two-phase write

The package's modules, one job each: :mod:`.write_error` (the error and its wording),
:mod:`.temp_names` (temporary names; the sweep of dead runs' files), :mod:`.commit_steps` (fsync, rename,
move), :mod:`.writable` (before any work), :mod:`.failures` (what a failed step does),
:mod:`.one_shot` (``with`` blocks that write one file), :mod:`.hdf5_guard` (HDF5 never sees an I/O
error), :mod:`.file_writers` (writers open across batches), :mod:`.file_sets` (files that make one
whole), :mod:`.convenience` (a whole file in one call; a log's line).
"""

from __future__ import annotations

from ..errors import ElmoFastError  # noqa: F401  (reached as durable.ElmoFastError)
from .commit_steps import commit, fsync_dir, fsync_path, move, remove_quietly
from .convenience import append_line, save_torch, write_bytes, write_json, write_text
from .failures import aborting, reading_back
from .file_sets import FileSet, together
from .file_writers import FileWriter, Hdf5Writer
from .hdf5_guard import GuardedFile, close_hdf5
from .one_shot import durable_hdf5, durable_open, durable_path, scratch_dir
from .temp_names import (
    NAME_MAX,
    TEMP_SUFFIX,
    TempFile,
    fitting_stem,
    host_tag,
    parse_temp_name,
    process_alive,
    sweep_temp_files,
    temp_files,
    temp_path,
)
from .writable import check_creatable, check_writable, make_dirs
from .write_error import OutputPathError, WriteError, describe_os_error

__all__ = [
    "WriteError",
    "OutputPathError",
    "TEMP_SUFFIX",
    "NAME_MAX",
    "fitting_stem",
    "temp_path",
    "parse_temp_name",
    "TempFile",
    "temp_files",
    "sweep_temp_files",
    "check_writable",
    "check_creatable",
    "make_dirs",
    "durable_path",
    "durable_open",
    "durable_hdf5",
    "Hdf5Writer",
    "GuardedFile",
    "FileWriter",
    "FileSet",
    "together",
    "scratch_dir",
    "aborting",
    "close_hdf5",
    "commit",
    "move",
    "fsync_path",
    "fsync_dir",
    "write_bytes",
    "write_text",
    "write_json",
    "save_torch",
    "append_line",
    "remove_quietly",
    "describe_os_error",
    "process_alive",
    "host_tag",
    "reading_back",
]
