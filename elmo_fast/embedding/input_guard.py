"""What the read stage guards against in an input: being read twice when it cannot be, and lines of
unbounded length.

* An input can be read again from its start only when it is a regular file (or a block device). A
  pipe, a FIFO, ``<(...)`` (``/dev/fd/N``), stdin (``-``), a character device or a socket gives
  its bytes once: such an input is opened once and read once, front to back. A resumed run then
  checks each window an interrupted run saved against the input's lines as they pass (their
  digest) and embeds the rest, so nothing is skipped; where a second pass would be needed, the run
  refuses with the reason (:mod:`.work_area`).
* A line is read in bounded pieces (``readline(limit + 2)``): a line longer than the limit is an
  error naming the file, the line and the limit before it is held whole, so ``/dev/zero`` or a
  2 GB line cannot exhaust memory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import IO

from ..textio import DEFAULT_MAX_LINE_LENGTH, check_max_line_length, line_too_long, without_line_end

__all__ = ["DEFAULT_MAX_LINE_LENGTH", "rereadable", "kind_of", "check_max_line_length", "bounded_lines"]


def rereadable(source: str | os.PathLike | IO) -> bool:
    """Whether ``source`` can be opened again and read from its start: a path of a regular file
    (or a block device), or of nothing yet (its reader reports that). Streams, ``-``, FIFOs,
    character devices and sockets cannot."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    path = os.fspath(source)
    if path == "-":
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True
    return not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode))


def kind_of(source: str | os.PathLike | IO) -> str:
    """What a source that cannot be read twice is, in words (for messages)."""
    if not isinstance(source, (str, os.PathLike)) or os.fspath(source) == "-":
        return "a stream"
    try:
        mode = os.stat(source).st_mode
    except OSError:
        return "a file"
    return (
        "a pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a character device"
        if stat.S_ISCHR(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a file"
    )


def bounded_lines(stream: IO[str], name: str, limit: int | None) -> Iterator[str]:
    """The lines of a text stream, each with its line end, none longer than ``limit`` characters
    (the line end aside): a longer one is an :class:`InputError` naming ``name`` and the line,
    raised once ``limit + 1`` characters of it are read. ``limit`` None: no bound."""
    if limit is None or not hasattr(stream, "readline"):
        yield from stream
        return
    number = 0
    while True:
        line = stream.readline(limit + 2)  # the line, and its "\r\n"
        if not line:
            return
        number += 1
        if len(line) > limit and len(without_line_end(line)) > limit:
            raise line_too_long(name, number, limit)
        yield line
