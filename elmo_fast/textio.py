"""Opening text files the way users hand them over: plain, gzip, bzip2 or xz (recognised by their
first bytes, not by their names), with a leading UTF-8 byte-order mark dropped."""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
from typing import IO

from .errors import InputError

#: magic bytes -> (name, opener of a binary stream)
COMPRESSIONS = {
    b"\x1f\x8b": ("gzip", gzip.open),
    b"BZh": ("bzip2", bz2.open),
    b"\xfd7zXZ\x00": ("xz", lzma.open),
}
BOM = "\ufeff"


def compression_of(head: bytes) -> str | None:
    """The compression a file starting with ``head`` uses (``"gzip"``, ``"bzip2"``, ``"xz"``), or None."""
    for magic, (name, _) in COMPRESSIONS.items():
        if head.startswith(magic):
            return name
    return None


def open_binary(path: str | os.PathLike) -> tuple[IO[bytes], str | None]:
    """``path`` opened for reading its (decompressed) bytes, and the compression found (or None)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a text file")
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    head = raw.read(6)
    raw.seek(0)
    for magic, (name, opener) in COMPRESSIONS.items():
        if head.startswith(magic):
            return opener(raw), name
    return raw, None


def iter_text_lines(path: str | os.PathLike, errors: str = "strict"):
    """Lines of a UTF-8 text file, compressed or not, without their line ends; a leading BOM is
    dropped. A line that is not UTF-8 (with ``errors="strict"``) or a corrupt compressed stream is
    an :class:`InputError` naming the file and the line."""
    path = os.fspath(path)
    stream, compression = open_binary(path)
    number = 0
    try:
        with stream:
            for number, raw in enumerate(stream, start=1):
                try:
                    line = raw.decode("utf-8", errors)
                except UnicodeDecodeError as e:
                    raise InputError(f"{path}: line {number} is not UTF-8 ({e.reason} at byte {e.start})") from None
                if number == 1 and line.startswith(BOM):
                    line = line[1:]
                yield line.rstrip("\r\n")
    except (OSError, EOFError, lzma.LZMAError, zlib_error()) as e:
        what = f"{compression} stream" if compression else "file"
        raise InputError(f"{path}: the {what} is corrupt or truncated after line {number} ({e})") from None


def zlib_error() -> type[BaseException]:
    import zlib

    return zlib.error


def text_stream(binary: IO[bytes]) -> io.TextIOWrapper:
    """A UTF-8 text view of a binary stream (a BOM at its start dropped)."""
    return io.TextIOWrapper(binary, encoding="utf-8-sig")
