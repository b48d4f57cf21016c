"""The digest of a file's content: one owner for every checksum the package records (a shard's, an
assembled output's, a model file's in a resume manifest, a corpus file's in a training run's)."""

from __future__ import annotations

import hashlib
import os

_CHUNK = 1 << 22


def hash_file(
    path: str | os.PathLike, algorithm: str = "sha256", *, digest_size: int | None = None, ends: int | None = None
) -> tuple[int, str]:
    """(size in bytes, hex digest) of a file. ``digest_size``: for blake2b. ``ends``: hash only the
    first and the last ``ends`` bytes of a file longer than twice that (a large corpus, checked
    quickly), else the whole file. Raises OSError."""
    h = hashlib.new(algorithm, **({"digest_size": digest_size} if digest_size else {}))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if ends is not None and size > 2 * ends:
            h.update(f.read(ends))
            f.seek(size - ends)
            h.update(f.read(ends))
            return size, h.hexdigest()
        size = 0
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()
