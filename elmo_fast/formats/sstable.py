"""LevelDB's table format (an SSTable), as TensorFlow writes a checkpoint's ``.index`` file.

Layout (LevelDB's ``doc/table_format.md``; TensorFlow's ``core/lib/io/table``)::

    [data block 1] [trailer] ... [data block N] [trailer]
    [meta-index block] [trailer] [index block] [trailer]
    [footer: meta-index handle, index handle (varint64 offset and size each), zero padding to
     40 bytes, magic 0xdb4775248b80fb57 as 8 little-endian bytes]

    trailer: 1 byte compression type (0: none) + 4 bytes masked CRC-32C of the block and that byte
    block:   entries, then uint32 restart offsets and their uint32 count; an entry is
             varint32 shared, varint32 unshared, varint32 value length, the key's unshared
             bytes (after the previous key's first ``shared``) and the value

The index block maps the last key of each data block to its handle. Every block's checksum is
verified, every handle and length bounds-checked, and keys must increase: a damaged or truncated
file is a :class:`~elmo_fast.errors.ModelFileError` naming it, never a wrong table.
"""

from __future__ import annotations

import os
import struct

from ..errors import ModelFileError
from .crc32c import crc32c, unmasked

MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
TRAILER_SIZE = 5
COMPRESSION_NAMES = {1: "Snappy", 2: "Zlib"}


class TableError(ModelFileError):
    """The file is not a whole, undamaged LevelDB table."""


def read_varint(buf: bytes, pos: int, limit: int, what: str, max_bytes: int = 10) -> tuple[int, int]:
    """A little-endian base-128 varint at ``pos``; returns (value, position after it). Raises
    ValueError (with ``what`` in its message) when it runs past ``limit`` or ``max_bytes``."""
    value = shift = 0
    for _ in range(max_bytes):
        if pos >= limit:
            raise ValueError(f"{what} runs past the end")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise ValueError(f"{what} is longer than {max_bytes} bytes")


def read_table(path: str | os.PathLike, what: str = "a TensorFlow checkpoint index") -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the table at ``path``, in key order."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise TableError(f"{path}: not found (expected {what})") from None
    except OSError as e:
        raise TableError(f"{path}: cannot read {what}: {e}") from None

    def bad(problem: str) -> TableError:
        return TableError(
            f"{path}: {problem}; expected {what} (a LevelDB table), whole and undamaged (truncated or corrupt?)"
        )

    if len(data) < FOOTER_SIZE:
        raise bad(f"{len(data)} bytes, shorter than a table's {FOOTER_SIZE}-byte footer")
    footer = data[-FOOTER_SIZE:]
    if struct.unpack("<Q", footer[-8:])[0] != MAGIC:
        raise bad("no table footer (its magic number is missing at the end of the file)")
    try:
        pos = 0
        handles = []
        for name in ("meta-index", "index"):
            offset, pos = read_varint(footer, pos, 40, f"the {name} block's offset")
            size, pos = read_varint(footer, pos, 40, f"the {name} block's size")
            handles.append((offset, size))
    except ValueError as e:
        raise bad(f"damaged footer: {e}") from None
    body_end = len(data) - FOOTER_SIZE

    def block(offset: int, size: int, name: str) -> bytes:
        if offset + size + TRAILER_SIZE > body_end:
            raise bad(
                f"the {name} at bytes {offset}..{offset + size + TRAILER_SIZE} runs past the end of the table "
                f"data ({body_end} bytes)"
            )
        contents = data[offset : offset + size]
        kind = data[offset + size]
        stored = struct.unpack("<I", data[offset + size + 1 : offset + size + TRAILER_SIZE])[0]
        if unmasked(stored) != crc32c(data[offset : offset + size + 1]):
            raise bad(f"checksum mismatch in the {name} at byte {offset}")
        if kind != 0:
            raise TableError(
                f"{path}: the {name} is {COMPRESSION_NAMES.get(kind, f'type-{kind}')}-compressed; "
                f"only uncompressed tables are read (TensorFlow writes its checkpoint indexes "
                f"uncompressed)"
            )
        return contents

    index_offset, index_size = handles[1]
    entries: list[tuple[bytes, bytes]] = []
    for last_key, handle in _block_entries(block(index_offset, index_size, "index block"), bad, "index block"):
        try:
            offset, p = read_varint(handle, 0, len(handle), "a data block's offset")
            size, _ = read_varint(handle, p, len(handle), "a data block's size")
        except ValueError as e:
            raise bad(f"index entry {last_key!r}: {e}") from None
        name = f"data block at byte {offset}"
        block_entries = _block_entries(block(offset, size, name), bad, name)
        if block_entries and block_entries[-1][0] > last_key:
            raise bad(f"the {name} ends with key {block_entries[-1][0]!r}, past its index key {last_key!r}")
        for key, value in block_entries:
            if entries and key <= entries[-1][0]:
                raise bad(f"keys out of order: {key!r} after {entries[-1][0]!r}")
            entries.append((key, value))
    return entries


def _block_entries(block: bytes, bad, name: str) -> list[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise bad(f"the {name} holds {len(block)} bytes, too few for its restart count")
    n_restarts = struct.unpack("<I", block[-4:])[0]
    end = len(block) - 4 - 4 * n_restarts
    if n_restarts < 1 or end < 0:
        raise bad(f"the {name} claims {n_restarts} restart points in {len(block)} bytes")
    out: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    try:
        while pos < end:
            shared, pos = read_varint(block, pos, end, "an entry's shared length", 5)
            unshared, pos = read_varint(block, pos, end, "an entry's key length", 5)
            value_len, pos = read_varint(block, pos, end, "an entry's value length", 5)
            if shared > len(key) or pos + unshared + value_len > end:
                raise ValueError("an entry's lengths run past the block")
            key = key[:shared] + block[pos : pos + unshared]
            pos += unshared
            out.append((key, block[pos : pos + value_len]))
            pos += value_len
    except ValueError as e:
        raise bad(f"damaged {name} at byte {pos}: {e}") from None
    return out
