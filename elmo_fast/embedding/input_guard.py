"""What the read stage guards against in an input: being read twice when it cannot be, and lines of
unbounded length.

* An input can be read again from its start only when it is a regular file (or a block device). A
  pipe, a FIFO, ``<(...)`` (``/dev/fd/N``), stdin (``-``), a character device or a socket gives
  its bytes once: such an input is opened once and read once, front to back. A resumed run then
  checks each window an interrupted run saved against the input's lines as they pass (their
  digest) and embeds the rest, so nothing is skipped; where a second pass would be needed, the run
  refuses with the reason (:mod:`.work_area`).
* A line is read in bounded pieces (``readline(limit + 1)``): a line longer than the limit is an
  error naming the file, the line and the limit before it is held whole, so ``/dev/zero`` or a
  2 GB line cannot exhaust memory.
"""
from __future__ import annotations

import os
import stat
from typing import IO, Iterator

from ..errors import InputError, Param

#: the longest line read by default, in characters (a sentence per line: ~150,000 words)
DEFAULT_MAX_LINE_LENGTH = 1_000_000


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
    return ("a pipe (FIFO)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a file")


def check_max_line_length(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InputError(Param("max_line_length"), f" must be an integer >= 1 (characters), got {value!r}")


def bounded_lines(stream: IO[str], name: str, limit: int | None) -> Iterator[str]:
    """The lines of a text stream, each with its line end, none longer than ``limit`` characters
    (the line end aside): a longer one is an :class:`InputError` naming ``name`` and the line,
    raised once ``limit + 1`` characters of it are read. ``limit`` None: no bound."""
    if limit is None or not hasattr(stream, "readline"):
        yield from stream
        return
    number = 0
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not (line.endswith("\n") and len(line.rstrip("\r\n")) <= limit):
            raise InputError(f"{name}: line {number} is longer than {limit:,} characters (one line holds one "
                             f"sentence; is this the right file?); pass a larger ", Param("max_line_length"),
                             " if it is meant")
        yield line
