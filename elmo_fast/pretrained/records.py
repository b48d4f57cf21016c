"""What was fetched, kept beside it: one small JSON record per cached model.

``record.json`` in a model's cache folder holds the model's name (as ``--model`` takes it), where it
came from (S3, a Hub repository and commit, a URL), its layout, and per file: its role, path, size,
SHA-256 and where it was fetched from; and when its digests were last checked. It is written through
:mod:`elmo_fast.durable`, so a record is whole or absent.

Every load from the cache compares the files' sizes with the record (a stat per file); the digests are
checked on the first load after a download and by ``elmo-fast models verify``. A file that differs is
a one-line :class:`~elmo_fast.errors.ModelFileError` naming the file, the expected and found values,
and the command that fetches it again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..durable import write_json
from ..errors import ModelFileError
from ..file_hash import hash_file

RECORD_NAME = "record.json"
FORMAT = 1


@dataclass(frozen=True)
class FileRecord:
    """One file of a model: ``role`` (options, weights, or an ELMoForManyLangs file's name), ``path``
    (relative to the record's folder, or absolute for a file kept elsewhere: the Hugging Face cache),
    ``size`` and ``sha256`` as fetched, ``origin`` (the URL or Hub path it came from; "found in the
    cache" for a file that was there before records were kept)."""

    role: str
    path: str
    size: int
    sha256: str
    origin: str


@dataclass(frozen=True)
class ModelRecord:
    """A cached model (see the module's docstring); ``folder``: where its record lives (not stored)."""

    spec: str
    source: dict
    layout: str
    files: tuple[FileRecord, ...]
    recorded: float
    verified: float | None = None
    folder: Path = field(default=Path("."), compare=False)

    def file_path(self, f: FileRecord) -> Path:
        return self.folder / f.path  # an absolute path stays itself

    def paths(self) -> dict[str, Path]:
        """role -> path of every file."""
        return {f.role: self.file_path(f) for f in self.files}

    def refetch_command(self) -> str:
        return f"elmo-fast models fetch {self.spec} --force"


def record_path(folder: Path) -> Path:
    return folder / RECORD_NAME


def read_record(folder: Path) -> ModelRecord | None:
    """The record in ``folder``, or None where there is none; an unreadable one is an error naming it."""
    path = record_path(folder)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ModelFileError(
            f"{path}: cannot read this model's record ({e}); remove it to fetch the model again"
        ) from None
    try:
        return ModelRecord(
            spec=data["spec"],
            source=dict(data["source"]),
            layout=data["layout"],
            files=tuple(FileRecord(**f) for f in data["files"]),
            recorded=float(data["recorded"]),
            verified=None if data.get("verified") is None else float(data["verified"]),
            folder=folder,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(
            f"{path}: not a model record of this elmo-fast ({e}); remove it to fetch the model again"
        ) from None


def write_record(record: ModelRecord) -> ModelRecord:
    """``record`` written to its folder (durably); returned for chaining."""
    data = {
        "format": FORMAT,
        "spec": record.spec,
        "source": record.source,
        "layout": record.layout,
        "files": [asdict(f) for f in record.files],
        "recorded": record.recorded,
        "verified": record.verified,
    }
    record.folder.mkdir(parents=True, exist_ok=True)
    write_json(record_path(record.folder), data)
    return record


def file_record(role: str, path: Path, folder: Path, origin: str, digest: tuple[int, str] | None = None) -> FileRecord:
    """The record of ``path`` (hashed now unless ``digest``, (size, sha256), is given); stored relative to
    ``folder`` when inside it."""
    size, sha = digest if digest is not None else hash_file(path)
    try:
        stored = str(path.relative_to(folder))
    except ValueError:
        stored = str(path)
    return FileRecord(role, stored, size, sha, origin)


def new_record(spec: str, source: dict, layout: str, files: list[FileRecord], folder: Path) -> ModelRecord:
    return ModelRecord(spec, source, layout, tuple(files), time.time(), None, folder)


def check_sizes(record: ModelRecord) -> None:
    """Each file there, of its recorded size (a stat each: every load from the cache)."""
    for f in record.files:
        path = record.file_path(f)
        try:
            size = os.stat(path).st_size
        except OSError as e:
            raise ModelFileError(
                f"{path}: missing from the cache ({e.strerror or e}); fetch it again with `{record.refetch_command()}`"
            ) from None
        if size != f.size:
            raise ModelFileError(
                f"{path}: {size} bytes, but {f.size} were recorded when it was fetched from {f.origin}: the file "
                f"changed or is damaged; fetch it again with `{record.refetch_command()}`"
            )


def verify(record: ModelRecord) -> ModelRecord:
    """Each file's SHA-256 against the record (the first error stops it), then the record with the time
    of this check, written."""
    for f in record.files:
        path = record.file_path(f)
        try:
            size, sha = hash_file(path)
        except OSError as e:
            raise ModelFileError(
                f"{path}: cannot read it ({e.strerror or e}); fetch it again with `{record.refetch_command()}`"
            ) from None
        if sha != f.sha256 or size != f.size:
            raise ModelFileError(
                f"{path}: SHA-256 {sha} ({size} bytes) does not match {f.sha256} ({f.size} bytes), recorded when "
                f"it was fetched from {f.origin}; fetch it again with `{record.refetch_command()}`"
            )
    return write_record(replace(record, verified=time.time()))


def checked(record: ModelRecord) -> ModelRecord:
    """``record``'s files checked as a load from the cache checks them: sizes always, the digests too
    when they have not been checked since the files were fetched."""
    check_sizes(record)
    return record if record.verified is not None else verify(record)


def all_records(cache: Path) -> Iterator[ModelRecord]:
    """Every model record under ``cache``, by folder."""
    if not cache.is_dir():
        return
    for path in sorted(cache.rglob(RECORD_NAME)):
        record = read_record(path.parent)
        if record is not None:
            yield record
