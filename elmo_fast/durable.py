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
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import secrets
import socket
import sys
import tempfile
from typing import IO, Any, Callable, Iterator, NamedTuple

from .errors import ElmoFastError

#: Suffix of every temporary file this module creates.
TEMP_SUFFIX = ".elmo-tmp"
# what a temporary name adds to the final one: "." + "." + host (<= 64) + "-" + pid + "." + 8 + a tag
# (".sentences", the longest the package uses) + suffix
_TEMP_OVERHEAD = 2 + 64 + 1 + 10 + 1 + 8 + 10 + len(TEMP_SUFFIX)


class WriteError(ElmoFastError):
    """A file could not be written whole (disk full, I/O error, no permission, name too long).

    Nothing was left under its final name. The message names the file and the OS error."""

    def __init__(self, path: str | os.PathLike, cause: BaseException | str) -> None:
        self.path = os.fspath(path)
        self.errno = getattr(cause, "errno", None)
        super().__init__(f"cannot write {self.path}: {describe_os_error(cause)}")

    def __reduce__(self):
        return _rebuild_write_error, (str(self), self.path, self.errno)


def _rebuild_write_error(message: str, path: str, err: int | None) -> WriteError:
    e = WriteError.__new__(WriteError)
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


#: The file opener of durable_open (tests swap it for one that fails the Nth write).
_open = open


def host_tag() -> str:
    """This host's name as temporary names hold it (letters, digits, ``_`` and ``-``; at most 64)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def temp_path(final: str | os.PathLike, tag: str | None = None) -> str:
    """A fresh temporary name for ``final``, in its folder (nothing is created). ``tag`` (lowercase
    letters) tells apart several temporary files of one final name, such as a scratch file kept beside
    the file itself: ``.NAME.HOST-PID.TOKEN.TAG.elmo-tmp``."""
    if tag is not None and not re.fullmatch(r"[a-z]+", tag):
        raise ValueError(f"a temporary name's tag is lowercase letters, not {tag!r}")
    final = os.path.abspath(os.fspath(final))
    directory, base = os.path.split(final)
    middle = f".{tag}" if tag else ""
    return os.path.join(directory,
                        f".{base}.{host_tag()}-{os.getpid()}.{secrets.token_hex(4)}{middle}{TEMP_SUFFIX}")


_TEMP_RE = re.compile(rf"^\.(?P<base>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[0-9]+)\.[0-9a-f]{{8}}"
                      rf"(?:\.(?P<tag>[a-z]+))?{re.escape(TEMP_SUFFIX)}$")


def parse_temp_name(name: str) -> tuple[str, str, int] | None:
    """``(final base name, host, pid)`` of one of our temporary names, else None."""
    m = _TEMP_RE.match(name)
    return (m.group("base"), m.group("host"), int(m.group("pid"))) if m else None


def process_alive(pid: int) -> bool:
    """Whether a process of this id runs on this host (a pid we cannot signal counts as alive)."""
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows: never call it dead there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TempFile(NamedTuple):
    """One of our temporary files found in a folder, and who made it."""
    path: str
    final_name: str
    host: str
    pid: int

    def owner(self) -> str:
        """``"gone"`` (made on this host by a process that has ended: a killed run's, safe to remove),
        ``"running"`` (a live process of this host, maybe this one), or ``"other host"``."""
        if self.host != host_tag():
            return "other host"
        return "running" if self.pid == os.getpid() or process_alive(self.pid) else "gone"


def temp_files(directory: str | os.PathLike, final_name: str | None = None) -> list[TempFile]:
    """Our temporary files in ``directory`` (of ``final_name`` only, when given), by name."""
    directory = os.fspath(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        parsed = parse_temp_name(name)
        if parsed is not None and (final_name is None or parsed[0] == final_name):
            found.append(TempFile(os.path.join(directory, name), *parsed))
    return found


def sweep_temp_files(directory: str | os.PathLike, final_name: str | None = None) -> list[str]:
    """Remove the temporary files in ``directory`` (of ``final_name`` only, when given) left by dead
    processes of this host; return their paths. A live process's files and other hosts' are kept."""
    removed = []
    for temp in temp_files(directory, final_name):
        if temp.owner() == "gone":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp.path)
                removed.append(temp.path)
    return removed


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


def _normal_mode(path: str) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def remove_quietly(*paths: str | os.PathLike | None) -> None:
    for p in paths:
        if p:
            with contextlib.suppress(OSError):
                os.unlink(p)


def check_writable(final: str | os.PathLike, what: str = "output") -> str:
    """Check, before any work, that ``final`` can be written durably: its folder exists and is a
    writable folder, the name (and our temporary name beside it) fits the filesystem, and it is not
    a folder. Returns the absolute path; raises :class:`WriteError` with the reason."""
    final = os.path.abspath(os.fspath(final))
    directory, base = os.path.split(final)
    if not base:
        raise WriteError(final, f"the {what} must be a file name, not a folder")
    if not os.path.isdir(directory):
        raise WriteError(final, f"its folder {directory} does not exist" if not os.path.exists(directory)
                         else f"{directory} is not a folder")
    if os.path.isdir(final):
        raise WriteError(final, f"the {what} is a folder")
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    if len(os.fsencode(base)) + _TEMP_OVERHEAD > name_max:
        raise WriteError(final, f"file name too long ({len(os.fsencode(base))} bytes; at most "
                                f"{name_max - _TEMP_OVERHEAD} here, leaving room for the temporary name)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise WriteError(final, f"Permission denied (EACCES): cannot create files in {directory}")
    return final


@contextlib.contextmanager
def _unraisable_errors() -> Iterator[list[BaseException]]:
    """Collect the exceptions Python would print as "Exception ignored in ..." (h5py reports a failed
    close of a dataset that the garbage collector frees that way) instead of losing them."""
    caught: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(info) -> None:
        if info.exc_value is not None and isinstance(info.exc_value, (OSError, RuntimeError)):
            caught.append(info.exc_value)
        else:
            previous(info)

    sys.unraisablehook = hook
    try:
        yield caught
    finally:
        sys.unraisablehook = previous


def commit(temp: str | os.PathLike, final: str | os.PathLike, sync: bool = True) -> None:
    """Step 3: fsync ``temp`` (written and closed), give it a normal file's mode, rename it onto
    ``final``, fsync the folder. For writers that manage their own temporary file; raises OSError.
    ``sync=False`` skips both fsyncs: the rename is still atomic (readers see the old file or the
    new one), but a power loss may lose it; only for advisory files rewritten every second."""
    temp, final = os.fspath(temp), os.fspath(final)
    if sync:
        fsync_path(temp)
    _normal_mode(temp)
    os.replace(temp, final)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(final)))


def move(path: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename a file that is whole on disk already (written through this module) onto ``final`` and
    fsync ``final``'s folder: the last step of a two-phase write, such as a resumable run's output,
    recorded as complete under a name of its own before it takes its final name. Both names must be
    on one filesystem. Raises :class:`WriteError` naming ``final``; the file stays where it was."""
    try:
        os.replace(os.fspath(path), os.fspath(final))
        fsync_dir(os.path.dirname(os.path.abspath(final)))
    except OSError as e:
        raise WriteError(final, e) from e


def _failed(final: str, temp: str, error: BaseException) -> BaseException:
    """Remove ``temp`` after ``error``; what to raise for it: the OS's and the libraries' errors as a
    :class:`WriteError` naming ``final``, the package's own errors and interruptions as they are."""
    remove_quietly(temp)
    if isinstance(error, ElmoFastError) or not isinstance(error, (OSError, RuntimeError, MemoryError)):
        return error
    return WriteError(final, error)


@contextlib.contextmanager
def durable_path(final: str | os.PathLike, *, check: Callable[[str], None] | None = None,
                 sync: bool = True) -> Iterator[str]:
    """Yield a temporary path beside ``final``; the body writes a whole file there and closes it.
    On a clean exit the file is checked (``check(temp)``, optional), fsync'ed and renamed onto
    ``final``. Any error removes it and raises :class:`WriteError` (an :class:`ElmoFastError` raised by
    the body, and KeyboardInterrupt/SystemExit, pass through unchanged, after the cleanup).
    ``sync=False``: see :func:`commit`."""
    final = os.path.abspath(os.fspath(final))
    temp = temp_path(final)
    try:
        with _unraisable_errors() as late:
            yield temp
            if late:
                raise late[0]
        if not os.path.exists(temp):
            raise FileNotFoundError(errno.ENOENT, "the writer created no file", temp)
        if check is not None:
            check(temp)
        commit(temp, final, sync)
    except BaseException as e:
        raised = _failed(final, temp, e)
        if raised is e:
            raise
        raise raised from e


@contextlib.contextmanager
def durable_open(final: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                 newline: str | None = None, sync: bool = True) -> Iterator[IO]:
    """A new file object ("w" text or "wb" bytes) under a temporary name, flushed, fsync'ed, closed
    and renamed onto ``final`` when the block ends cleanly (:func:`durable_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"durable_open writes new files: mode 'w' or 'wb', not {mode!r}")
    binary = mode == "wb"
    with durable_path(final, sync=sync) as temp:
        f = _open(temp, "xb" if binary else "x", encoding=None if binary else encoding,
                  newline=None if binary else newline)
        try:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        finally:
            f.close()  # a close that fails raises here: the write is then an error, not an output


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
                view[lo - self._pos:hi - self._pos] = data[lo - offset:hi - offset]
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


class Hdf5Writer:
    """A new HDF5 file written durably, open for as long as its writer needs: ``file`` is the
    ``h5py.File`` (under a temporary name beside ``final``); :meth:`check` raises as soon as a write
    has failed (call it between batches: a full disk stops the work at once); :meth:`finish` closes
    every object, checks, fsyncs, closes and renames onto ``final``; :meth:`abort` throws it away.
    Either leaves nothing behind but a whole file under ``final`` or nothing at all."""

    def __init__(self, final: str | os.PathLike, **h5py_kwargs: Any) -> None:
        import h5py

        self.final = os.path.abspath(os.fspath(final))
        self.temp = temp_path(self.final)
        self._fd: int | None = None
        self.file = None
        try:
            self._fd = os.open(self.temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            self._guard = GuardedFile(self._fd)
            self.file = h5py.File(self._guard, "w", **h5py_kwargs)
            self.check()
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError):
                raise WriteError(self.final, e) from e
            raise

    @property
    def failed(self) -> bool:
        return self._guard.error is not None

    def check(self) -> None:
        self._guard.check(self.final)

    def finish(self) -> None:
        self.seal()
        _rename_sealed(self)

    def seal(self) -> None:
        """Close every object, check, fsync and close: the temporary file is whole on disk, not yet
        renamed (:func:`together` renames several sealed files at once)."""
        try:
            close_hdf5(self.file)
            self.check()
            os.fsync(self._fd)  # on the descriptor that wrote: a new one may not see a writeback error
            fd, self._fd = self._fd, None
            os.close(fd)
        except BaseException as e:
            self.abort()
            if isinstance(e, (OSError, RuntimeError)):
                raise WriteError(self.final, e) from e
            raise

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


class FileWriter:
    """A new text ("w") or binary ("wb") file written durably, open for as long as its writer needs:
    :class:`Hdf5Writer`'s twin for plain files. ``file`` is the file object (under a temporary name
    beside ``final``); :meth:`finish` flushes, fsyncs, closes and renames it onto ``final``;
    :meth:`abort` throws it away. ``tag`` tells apart several temporary files of one final name, such
    as a scratch file that only serves the writer of ``final`` and is aborted once used: a killed
    run's is swept like any temporary file."""

    def __init__(self, final: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                 newline: str | None = None, tag: str | None = None) -> None:
        if mode not in ("w", "wb"):
            raise ValueError(f"a FileWriter writes a new file: mode 'w' or 'wb', not {mode!r}")
        self.final = os.path.abspath(os.fspath(final))
        self.temp = temp_path(self.final, tag)
        self.file: IO | None = None
        binary = mode == "wb"
        try:
            self.file = _open(self.temp, "xb" if binary else "x", encoding=None if binary else encoding,
                              newline=None if binary else newline)
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError):
                raise WriteError(self.final, e) from e
            raise

    def write(self, data) -> int:
        """``file.write(data)``; an OSError (a full disk) is a :class:`WriteError` naming the final file."""
        try:
            return self.file.write(data)
        except OSError as e:
            raise WriteError(self.final, e) from e

    def close(self) -> str:
        """Close a scratch file that is read back, never finished, with its errors checked (a close
        that fails may have lost what was buffered): a :class:`WriteError` naming the final file.
        Returns its path; :meth:`abort` removes it."""
        f, self.file = self.file, None
        if f is not None:
            try:
                f.close()
            except OSError as e:
                raise WriteError(self.final, e) from e
        return self.temp

    def finish(self) -> None:
        self.seal()
        _rename_sealed(self)

    def seal(self) -> None:
        """Flush, fsync and close: the temporary file is whole on disk, not yet renamed."""
        try:
            f, self.file = self.file, None
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()  # a close that fails raises here: the write is then an error, not an output
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError):
                raise WriteError(self.final, e) from e
            raise


    def abort(self) -> None:
        if self.file is not None:
            with contextlib.suppress(Exception):
                self.file.close()
            self.file = None
        remove_quietly(self.temp)


@contextlib.contextmanager
def scratch_dir(prefix: str = "elmo-fast-") -> Iterator[str]:
    """A private temporary folder (in the system's temporary area) for files that are never outputs,
    such as a model written only to be read back: removed with its content on leaving the block,
    however it is left. Outputs never pass through it: they are written beside their final name."""
    with tempfile.TemporaryDirectory(prefix=prefix) as directory:
        yield directory


@contextlib.contextmanager
def durable_hdf5(final: str | os.PathLike, **h5py_kwargs: Any) -> Iterator[Any]:
    """A new ``h5py.File`` under a temporary name (:class:`Hdf5Writer`); on a clean exit every object
    in it is closed, the write checked, the file fsync'ed and renamed onto ``final``."""
    writer = Hdf5Writer(final, **h5py_kwargs)
    try:
        yield writer.file
    except BaseException:
        writer.abort()
        raise
    writer.finish()


def _rename_sealed(writer: Hdf5Writer | FileWriter, sync_dir: bool = True) -> None:
    """Step 3 for a sealed writer's file (whole and fsync'ed): :func:`commit`; ``sync_dir=False``
    only gives it its mode and renames it (:func:`together` fsyncs the folders once, after all)."""
    try:
        if sync_dir:
            commit(writer.temp, writer.final)
        else:
            _normal_mode(writer.temp)
            os.replace(writer.temp, writer.final)
    except BaseException as e:
        writer.abort()
        if isinstance(e, OSError):
            raise WriteError(writer.final, e) from e
        raise


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
        _rename_sealed(writer, sync_dir=False)
    for directory in sorted({os.path.dirname(w.final) for w in files.writers}):
        try:
            fsync_dir(directory)
        except OSError as e:
            raise WriteError(files.writers[-1].final, e) from e


def close_hdf5(f: Any) -> None:
    """Flush and close an open ``h5py.File`` so that an error is an exception here, never an
    "Exception ignored" from the garbage collector later. h5py's close closes every object of the
    file still open (datasets or groups referenced elsewhere included), so nothing of the file is
    left for the collector to close; no ``gc.collect()`` (0.15 s with torch loaded, per file)."""
    with _unraisable_errors() as late:
        f.flush()
        f.close()
    if late:
        raise late[0]


@contextlib.contextmanager
def reading_back(final: str | os.PathLike) -> Iterator[None]:
    """Around reading back what was written on the way to ``final`` (a scratch file, the parts a file
    is assembled from, a checksum of what was just written): an I/O error there (even a failed close
    of a file opened to read) fails the write of ``final``, as a :class:`WriteError` naming it."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        if isinstance(e, ElmoFastError):
            raise
        raise WriteError(final, e) from e


def write_bytes(final: str | os.PathLike, data: bytes) -> None:
    with durable_open(final, "wb") as f:
        f.write(data)


def write_text(final: str | os.PathLike, text: str, encoding: str = "utf-8", newline: str | None = None,
               sync: bool = True) -> None:
    with durable_open(final, "w", encoding=encoding, newline=newline, sync=sync) as f:
        f.write(text)


def write_json(final: str | os.PathLike, obj: Any, *, sync: bool = True, **dump_kwargs: Any) -> None:
    """``obj`` as JSON (``dump_kwargs`` go to json.dump; default ``indent=2``), with a final newline."""
    dump_kwargs.setdefault("indent", 2)
    text = json.dumps(obj, **dump_kwargs) + "\n"  # encoded before the file exists: a bad object writes nothing
    write_text(final, text, sync=sync)


def save_torch(obj: Any, final: str | os.PathLike, **save_kwargs: Any) -> None:
    """``torch.save(obj, final, **save_kwargs)``, durably: torch's late errors (a full disk at the
    zip's end) are a :class:`WriteError`, never a traceback or a truncated file under ``final``."""
    import torch

    with durable_open(final, "wb") as f:
        recorder = _RecordingWriter(f)
        try:
            torch.save(obj, recorder, **save_kwargs)
        except Exception as e:
            # torch's zip writer turns the file's OSError into "unexpected pos ...": name the OS error
            raise (recorder.error or e) from e


class _RecordingWriter:
    """A binary file that remembers the first OSError its writes raised."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line to a log such as ``metrics.jsonl`` and fsync it. An append cannot be atomic;
    readers of such logs must tolerate a torn last line (a crash mid-append), which this never
    leaves behind on a clean error: the file is truncated back to its old size."""
    path = os.fspath(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise WriteError(path, e) from e
    finally:
        try:
            os.close(fd)
        except OSError as e:  # the line is whole and fsync'ed, but the OS reported an error: say so
            raise WriteError(path, e) from e


__all__ = [
    "WriteError", "TEMP_SUFFIX", "temp_path", "parse_temp_name", "TempFile", "temp_files", "sweep_temp_files",
    "check_writable", "durable_path", "durable_open", "durable_hdf5", "Hdf5Writer", "GuardedFile", "FileWriter",
    "FileSet", "together",
    "close_hdf5", "commit", "move", "fsync_path", "fsync_dir", "write_bytes", "write_text", "write_json",
    "save_torch", "append_line", "remove_quietly", "describe_os_error", "process_alive", "host_tag", "reading_back",
]
