"""TensorFlow checkpoints (the V2 "tensor bundle" that ``tf.train.Saver`` and TF-Hub modules
write), read without TensorFlow or protobuf.

A checkpoint ``PREFIX`` is::

    PREFIX.index                          a LevelDB table (:mod:`.sstable`): key "" holds a
                                          BundleHeaderProto, every other key is a tensor's name
                                          and holds its BundleEntryProto
    PREFIX.data-00000-of-0000N, ...       the tensors' raw bytes, N shards

    BundleHeaderProto  1: num_shards  2: endianness (0 little, 1 big)  3: version
    BundleEntryProto   1: dtype  2: shape (TensorShapeProto: 2: dim {1: size})  3: shard_id
                       4: offset  5: size  6: crc32c (fixed32, masked CRC-32C of the bytes)
                       7: slices (a partitioned tensor, stored as slices under other keys)

:class:`TensorBundle` opens the index (every block checksum verified), checks that every shard
is there and long enough for the tensors it holds, and :meth:`TensorBundle.read` returns a tensor
as a numpy array after verifying its CRC-32C. Beside a training run's checkpoints TensorFlow keeps
a ``checkpoint`` file naming the latest one (:func:`read_checkpoint_state`).

Every problem is a :class:`~elmo_fast.errors.ModelFileError` naming the file and what was expected.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError
from ..textio import text_lines
from .crc32c import crc32c, unmasked
from .sstable import read_table, read_varint

#: TensorFlow's DataType enum (types.proto) -> numpy, for the types a model's variables hold
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("float32"),
    2: np.dtype("float64"),
    3: np.dtype("int32"),
    4: np.dtype("uint8"),
    5: np.dtype("int16"),
    6: np.dtype("int8"),
    9: np.dtype("int64"),
    10: np.dtype("bool"),
    14: np.dtype("uint16"),  # bfloat16: read as its bits, widened by read()
    17: np.dtype("uint16"),
    19: np.dtype("float16"),
    22: np.dtype("uint32"),
    23: np.dtype("uint64"),
}
DTYPE_NAMES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    20: "resource",
    21: "variant",
    22: "uint32",
    23: "uint64",
}
DT_BFLOAT16 = 14


def _fields(buf: bytes, what: str) -> list[tuple[int, int, int | bytes]]:
    """Protocol buffer wire format: (field number, wire type, value) for every field of a message;
    varint and fixed fields as ints, length-delimited ones as bytes."""
    out = []
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = read_varint(buf, pos, end, f"a field tag of {what}")
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = read_varint(buf, pos, end, f"field {number} of {what}")
        elif wire == 1 or wire == 5:
            n = 8 if wire == 1 else 4
            if pos + n > end:
                raise ValueError(f"field {number} of {what} runs past the end")
            value = int.from_bytes(buf[pos : pos + n], "little")
            pos += n
        elif wire == 2:
            n, pos = read_varint(buf, pos, end, f"the length of field {number} of {what}")
            if pos + n > end:
                raise ValueError(f"field {number} of {what} runs past the end")
            value = buf[pos : pos + n]
            pos += n
        else:
            raise ValueError(f"{what} has a field of unknown wire type {wire}")
        out.append((number, wire, value))
    return out


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its dtype (TensorFlow's enum), shape, shard, byte range and checksum."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None  # masked, as stored; None when the entry has none
    sliced: bool = False

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"DataType {self.dtype}")


def _parse_entry(name: str, value: bytes) -> TensorEntry:
    dtype, shape, shard, offset, size, crc, sliced = 0, [], 0, 0, 0, None, False
    for number, wire, v in _fields(value, f"the entry of '{name}'"):
        if number == 1 and wire == 0:
            dtype = v
        elif number == 2 and wire == 2:
            for n2, w2, dim in _fields(v, f"the shape of '{name}'"):
                if n2 == 2 and w2 == 2:
                    size_of = [
                        _int64(x) for n3, w3, x in _fields(dim, f"a dimension of '{name}'") if n3 == 1 and w3 == 0
                    ]
                    shape.append(size_of[-1] if size_of else 0)
                elif n2 == 3 and w2 == 0 and v:
                    raise ValueError(f"'{name}' has an unknown rank")
        elif number == 3 and wire == 0:
            shard = v
        elif number == 4 and wire == 0:
            offset = _int64(v)
        elif number == 5 and wire == 0:
            size = _int64(v)
        elif number == 6 and wire == 5:
            crc = v
        elif number == 7:
            sliced = True
    if any(d < 0 for d in shape) or offset < 0 or size < 0:
        raise ValueError(f"'{name}' has a negative dimension, offset or size")
    return TensorEntry(name, dtype, tuple(shape), shard, offset, size, crc, sliced)


def shard_path(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


class TensorBundle:
    """A TensorFlow V2 checkpoint, by its prefix (``dir/model.ckpt-1000``, ``module/variables/variables``).

    ``entries``: name -> :class:`TensorEntry`, in the index's (sorted) order.
    """

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = os.fspath(prefix)
        self.index_path = self.prefix + ".index"
        rows = read_table(self.index_path, "a TensorFlow checkpoint index")
        if not rows or rows[0][0] != b"":
            raise ModelFileError(
                f'{self.index_path}: no bundle header (the entry of key ""); expected a TensorFlow V2 checkpoint index'
            )
        self.num_shards, big_endian = 1, False
        try:
            for number, wire, v in _fields(rows[0][1], "the bundle header"):
                if number == 1 and wire == 0:
                    self.num_shards = v
                elif number == 2 and wire == 0:
                    big_endian = v == 1
            self.entries: dict[str, TensorEntry] = {}
            for key, value in rows[1:]:
                name = key.decode("utf-8", "backslashreplace")
                self.entries[name] = _parse_entry(name, value)
        except ValueError as e:
            raise ModelFileError(f"{self.index_path}: damaged checkpoint index: {e}") from None
        self.byte_order = ">" if big_endian else "<"
        if self.num_shards < 1:
            raise ModelFileError(
                f"{self.index_path}: the header names {self.num_shards} data shards; expected at least 1"
            )
        self._check_shards()

    def shard_path(self, shard: int) -> str:
        return shard_path(self.prefix, shard, self.num_shards)

    def _check_shards(self) -> None:
        sizes = {}
        for shard in range(self.num_shards):
            path = self.shard_path(shard)
            try:
                sizes[shard] = os.path.getsize(path)
            except FileNotFoundError:
                raise ModelFileError(
                    f"{path}: missing (the checkpoint index {os.path.basename(self.index_path)} names "
                    f"{self.num_shards} data shard(s), of which this is number {shard})"
                ) from None
            except OSError as e:
                raise ModelFileError(f"{path}: cannot read data shard: {e}") from None
        for e in self.entries.values():
            if e.sliced:
                continue
            if e.shard >= self.num_shards:
                raise ModelFileError(
                    f"{self.index_path}: tensor '{e.name}' is in shard {e.shard}, but the header names "
                    f"{self.num_shards} shard(s)"
                )
            if e.offset + e.size > sizes[e.shard]:
                raise ModelFileError(
                    f"{self.shard_path(e.shard)}: {sizes[e.shard]} bytes, but tensor '{e.name}' "
                    f"needs bytes {e.offset}..{e.offset + e.size} (truncated data shard?)"
                )

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy array (bfloat16 widened to float32), its checksum verified."""
        e = self.entries[name]
        if e.sliced:
            raise ModelFileError(
                f"{self.index_path}: tensor '{name}' is partitioned into slices, which this reader "
                f"does not join; expected whole tensors (as bilm-tf and TF-Hub save them)"
            )
        if e.dtype not in DTYPES:
            raise ModelFileError(
                f"{self.index_path}: tensor '{name}' has dtype {e.dtype_name}; expected a numeric type"
            )
        dtype = DTYPES[e.dtype].newbyteorder(self.byte_order)
        count = int(np.prod(e.shape, dtype=np.int64))
        if count * dtype.itemsize != e.size:
            raise ModelFileError(
                f"{self.index_path}: tensor '{name}' of shape {e.shape} and dtype {e.dtype_name} "
                f"should take {count * dtype.itemsize} bytes, its entry says {e.size}"
            )
        path = self.shard_path(e.shard)
        try:
            with open(path, "rb") as f:
                f.seek(e.offset)
                raw = f.read(e.size)
        except OSError as err:
            raise ModelFileError(f"{path}: cannot read tensor '{name}': {err}") from None
        if len(raw) != e.size:
            raise ModelFileError(
                f"{path}: ends inside tensor '{name}' (bytes {e.offset}..{e.offset + e.size}; truncated data shard?)"
            )
        if e.crc32c is not None and crc32c(raw) != unmasked(e.crc32c):
            raise ModelFileError(
                f"{path}: checksum mismatch in tensor '{name}' (bytes {e.offset}..{e.offset + e.size}): "
                f"the data shard is damaged"
            )
        array = np.frombuffer(raw, dtype=dtype).reshape(e.shape)
        if e.dtype == DT_BFLOAT16:
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(dtype.newbyteorder("="), copy=False)


# ---------------------------------------------------------------------------------------------
# The ``checkpoint`` file beside a run's checkpoints (a CheckpointState in protobuf text format)

_STATE_LINE = re.compile(r'^\s*(\w+)\s*:\s*"((?:[^"\\]|\\.)*)"\s*$')
_ESCAPES = {
    "n": b"\n",
    "t": b"\t",
    "r": b"\r",
    '"': b'"',
    "'": b"'",
    "\\": b"\\",
    "a": b"\a",
    "b": b"\b",
    "f": b"\f",
    "v": b"\v",
    "?": b"?",
}


def _unescape(text: str) -> str:
    """A protobuf text-format string (C escapes; bytes beyond ASCII as octal) as UTF-8 text."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in "01234567":
            m = re.match(r"[0-7]{1,3}", text[i + 1 :])
            out.append(int(m.group(0), 8) & 0xFF)
            i += 1 + len(m.group(0))
        elif nxt == "x" and re.match(r"[0-9a-fA-F]{1,2}", text[i + 2 :]):
            m = re.match(r"[0-9a-fA-F]{1,2}", text[i + 2 :])
            out.append(int(m.group(0), 16))
            i += 2 + len(m.group(0))
        else:
            out += _ESCAPES.get(nxt, nxt.encode("utf-8"))
            i += 2
    return out.decode("utf-8", "surrogateescape")


def read_checkpoint_state(path: str | os.PathLike) -> tuple[str | None, list[str]]:
    """The ``checkpoint`` file's latest checkpoint path and all the paths it lists, as written
    (paths on the machine that trained: callers take their base names)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            lines = text_lines(f.read())
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read TensorFlow's checkpoint list: {e}") from None
    latest, listed = None, []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        m = _STATE_LINE.match(line)
        if m is None:
            if re.match(r"^\s*\w+\s*:\s*[-+0-9.eE]+\s*$", line):  # timestamps
                continue
            raise ModelFileError(
                f"{path}: line {n} is not TensorFlow's checkpoint list (expected "
                f'model_checkpoint_path: "..." lines), got {line[:80]!r}'
            )
        key, value = m.group(1), _unescape(m.group(2))
        if key == "model_checkpoint_path":
            latest = value
        elif key == "all_model_checkpoint_paths":
            listed.append(value)
    return latest, listed
