"""Opening text the way users hand it over: plain, gzip, bzip2 or xz (recognised by their first
bytes, not by their names: a name can lie, and stdin has none), from paths, seekable streams or
pipes, with a leading UTF-8 byte-order mark dropped. Formats that are not text (zstd, zip, 7z, lz4,
HDF5) are named instead of being decoded, line by line, into garbage. One reader for the corpus
embedder (:mod:`elmo_fast.embedding.lines`) and for training corpora.

A line ends at ``"\n"`` (or ``"\r\n"``) only, everywhere the package reads text, as ``wc -l`` counts
lines: a lone ``"\r"``, and the other characters Python's universal newlines and ``str.splitlines()``
break at (``"\x0b"``, ``"\x1c"``, ``"\x85"``, ``"\u2028"``, ...), are characters of their line
(:func:`text_lines`; text streams are opened with ``newline="\n"``)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import zlib
from collections.abc import Iterator
from typing import IO

from .errors import InputError, Param

# What a file's first bytes say it is: the formats read transparently, by content (a name can lie,
# and stdin has none). bzip2's "BZh" is followed by the block size and a block's or the end's magic,
# so that a text file that starts with "BZh" is not taken for one.
_COMPRESSED = (
    ("gzip", re.compile(rb"\x1f\x8b")),
    ("bzip2", re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")),
    ("xz", re.compile(rb"\xfd7zXZ\x00")),
)
# formats we do not read, named instead of being decoded as text, line by line, into garbage
_UNREADABLE = (
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d"),
    (b"PK\x03\x04", "a zip archive", "unzip"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive", "7z x"),
    (b"\x04\x22\x4d\x18", "lz4-compressed", "lz4 -d"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file", None),
)
_SNIFF = 10
# what a damaged compressed stream raises while it is read, depending on the format and the damage
DECOMPRESSION_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
BOM = "\ufeff"
#: the longest line read by default, in characters (a sentence per line: ~150,000 words)
DEFAULT_MAX_LINE_LENGTH = 1_000_000


def without_line_end(line: str) -> str:
    """``line`` without its ``"\n"`` or ``"\r\n"`` (a lone ``"\r"`` is a character of the line)."""
    if line.endswith("\n"):
        return line[:-2] if line.endswith("\r\n") else line[:-1]
    return line


def text_lines(text: str) -> list[str]:
    """The lines of ``text``, without their line ends: a line ends at ``"\n"`` or ``"\r\n"`` only
    (unlike ``str.splitlines()``); a final line end makes no empty last line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def check_max_line_length(value: int | None) -> None:
    """A ``max_line_length`` must be an integer >= 1, or None (no bound)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InputError(Param("max_line_length"), f" must be an integer >= 1 (characters), got {value!r}")


def line_too_long(name: str, number: int, limit: int) -> InputError:
    """The error for a line longer than ``limit`` characters (``max_line_length``)."""
    return InputError(
        f"{name}: line {number} is longer than {limit:,} characters (one line holds one sentence; is "
        f"this the right file?); pass a larger ",
        Param("max_line_length"),
        " if it is meant",
    )


class _Prefixed(io.RawIOBase):
    """The bytes already read from a stream that cannot seek back, then the rest of it; closing this
    leaves the stream open (it is the caller's)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        # read1: what the pipe holds now, not a full buffer's worth, so that a line is read when it arrives
        data = self.rest.read1(len(buffer)) if hasattr(self.rest, "read1") else self.rest.read(len(buffer))
        if not data:
            return 0
        buffer[: len(data)] = data
        return len(data)


def _sniff(stream: IO[bytes]) -> tuple[bytes, IO[bytes], bool]:
    """(the first bytes, a stream that still starts at them, whether that stream is a wrapper of ours)."""
    if stream.seekable():
        position = stream.tell()
        head = stream.read(_SNIFF)
        stream.seek(position)
        return head, stream, False
    head = b""
    while len(head) < _SNIFF and (more := stream.read(_SNIFF - len(head))):  # a pipe may give a byte at a time
        head += more
    return head, io.BufferedReader(_Prefixed(head, stream)), True


def compression_of(head: bytes) -> str | None:
    """ "gzip", "bzip2", "xz" or None (plain), from a file's first bytes."""
    return next((kind for kind, magic in _COMPRESSED if magic.match(head)), None)


def _decompressed(kind: str | None, stream: IO[bytes]) -> IO[bytes]:
    if kind == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if kind == "bzip2":
        return bz2.BZ2File(stream, "rb")
    if kind == "xz":
        return lzma.LZMAFile(stream, "rb")
    return stream


class TextInput:
    """An input opened for reading: its lines as text whose undecodable bytes are kept as surrogates
    (so that the line holding them can be named), decompressed when its content is compressed."""

    def __init__(self, source: str | os.PathLike | IO) -> None:
        self.owned: list[IO] = []  # opened here, innermost first; closed at the end, outermost first
        self.detach = False  # a TextIOWrapper put directly on the caller's binary stream: detached, not closed
        self.compression: str | None = None
        if isinstance(source, (str, os.PathLike)):
            self.name = os.fspath(source)
            try:
                raw = open(self.name, "rb")
            except FileNotFoundError:
                raise InputError(f"{self.name}: input file not found") from None
            except OSError as e:
                raise InputError(f"{self.name}: cannot read the input: {e.strerror or e}") from None
            self.owned.append(raw)
            binary: IO[bytes] | None = raw
        else:
            self.name = str(getattr(source, "name", "<input>"))
            binary = source if isinstance(source, (io.RawIOBase, io.BufferedIOBase)) else None
        if binary is None:  # a text stream: decoded already, by its owner
            self.stream: IO[str] = source  # type: ignore[assignment]
            self.binary = None
            return
        try:
            head, binary, ours = _sniff(binary)
        except OSError as e:
            self.close()
            raise InputError(f"{self.name}: cannot read the input: {e.strerror or e}") from None
        if ours:
            self.owned.append(binary)
        for magic, what, how in _UNREADABLE:
            if head.startswith(magic):
                self.close()
                hint = f"; extract the text first ({how})" if how else "; give the text file of sentences"
                raise InputError(
                    f"{self.name} is {what}, not text: elmo-fast reads plain, gzip, bzip2 and xz text{hint}"
                )
        self.compression = compression_of(head)
        if self.compression:
            binary = _decompressed(self.compression, binary)
            self.owned.append(binary)
        #: the input's bytes, decompressed (read either these or ``stream``, not both)
        self.binary = binary
        # newline="\n": lines end at "\n" only, untranslated (a lone "\r" stays in its line)
        self.stream = io.TextIOWrapper(binary, encoding="utf-8", errors="surrogateescape", newline="\n")
        if binary is source:
            self.detach = True
        else:
            self.owned.append(self.stream)

    def close(self) -> None:
        if self.detach:
            self.stream.detach()  # type: ignore[attr-defined]  (leave the caller's binary stream open)
            self.detach = False
        for f in reversed(self.owned):
            try:
                f.close()
            except Exception:  # noqa: BLE001  (closing a damaged stream may fail: nothing left to save)
                pass
        self.owned = []


def iter_text_lines(
    path: str | os.PathLike, errors: str = "strict", max_line_length: int | None = DEFAULT_MAX_LINE_LENGTH
) -> Iterator[str]:
    """Lines of a UTF-8 text file (plain or compressed), without their line ends (``"\n"`` or
    ``"\r\n"``: a lone ``"\r"`` does not end a line); a leading BOM is dropped. A line that is not
    UTF-8 (with ``errors="strict"``), a NUL byte, a line longer than ``max_line_length`` characters
    (found before it is held whole; None: no bound), or a damaged compressed stream is an
    :class:`InputError` naming the file and the line."""
    source = TextInput(path)
    number = 0
    # a line of at most `limit` characters has at most 4 bytes a character, and its line end
    read_bytes = -1 if max_line_length is None else 4 * max_line_length + 3
    try:
        binary = source.binary
        while raw := binary.readline(read_bytes):
            number += 1
            if read_bytes > 0 and len(raw) == read_bytes and not raw.endswith(b"\n"):
                raise line_too_long(source.name, number, max_line_length)
            if b"\0" in raw:
                raise InputError(f"{source.name}: line {number} holds a NUL byte: binary data, not text")
            try:
                line = raw.decode("utf-8", errors)
            except UnicodeDecodeError as e:
                after = f" (after {source.compression} decompression)" if source.compression else ""
                raise InputError(
                    f"{source.name}: line {number}{after} is not UTF-8 ({e.reason} at byte {e.start} of the line)"
                ) from None
            if number == 1 and line.startswith(BOM):
                line = line[1:]
            line = without_line_end(line)
            if max_line_length is not None and len(line) > max_line_length:
                raise line_too_long(source.name, number, max_line_length)
            yield line
    except DECOMPRESSION_ERRORS as e:
        raise InputError(
            f"{source.name}: the {source.compression or 'input'} stream is damaged or truncated after "
            f"line {number} ({e})"
        ) from None
    finally:
        source.close()
