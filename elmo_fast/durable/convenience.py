"""Convenience writers: a whole file from bytes, text, JSON or a torch object in one call, and the
one append (a log's line)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import IO, Any

from .one_shot import durable_open
from .write_error import WriteError


def write_bytes(final: str | os.PathLike, data: bytes) -> None:
    with durable_open(final, "wb") as f:
        f.write(data)


def write_text(
    final: str | os.PathLike, text: str, encoding: str = "utf-8", newline: str | None = None, sync: bool = True
) -> None:
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
