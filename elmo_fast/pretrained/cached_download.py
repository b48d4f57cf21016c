"""A model's files downloaded over HTTP(S) into one cache folder, once, with their record.

Used by the official models (:mod:`.official`) and models by URL (:mod:`.url_model`): the files go to
``folder`` through :func:`.http_download.download` under the model's fetch lock (a second process waits,
then finds them), and ``record.json`` beside them says where each came from, its size and SHA-256.
Every later load checks the sizes; the first load after a download checks the digests too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DownloadError
from .fetch_lock import FetchLock
from .http_download import download
from .records import ModelRecord, check_sizes, checked, file_record, new_record, read_record, write_record

#: a file's origin in a record when it was in the cache before any record was kept (placed by hand, or
#: downloaded by an earlier elmo-fast): its digest is taken the first time it is loaded
FOUND = "found in the cache"


@dataclass(frozen=True)
class Wanted:
    """One file of a model: its role, URL, name in the folder and, for a pinned file, its SHA-256."""

    role: str
    url: str
    name: str
    sha256: str | None = None


@dataclass(frozen=True)
class Fetch:
    """A model to fetch into ``folder``: its name as ``--model`` takes it (``spec``), where it comes from
    (``source``, kept in the record), what messages call it, and the hint of a network failure."""

    spec: str
    source: dict
    what: str
    bar: str
    folder: Path
    lock_root: Path
    lock_key: str
    offline_hint: str


def fetch_files(job: Fetch, files: list[Wanted], *, progress: bool, timeout: float, force: bool = False) -> ModelRecord:
    """The record of ``job``'s model, its files in the cache and checked (see the module's docstring)."""
    if not force:
        record = read_record(job.folder)
        if record is not None and record.verified is not None and _complete(record, files):
            check_sizes(record)  # the cheap check of every load; no lock, nothing written
            return record
    with FetchLock(job.lock_root, job.lock_key, job.what, quiet=not progress):
        record = None if force else read_record(job.folder)
        if record is None or not _complete(record, files):
            record = _download_missing(job, files, progress=progress, timeout=timeout, force=force)
        return checked(record)


def _complete(record: ModelRecord, files: list[Wanted]) -> bool:
    return {f.role for f in record.files} >= {w.role for w in files}


def _download_missing(job: Fetch, files: list[Wanted], *, progress: bool, timeout: float, force: bool) -> ModelRecord:
    folder = job.folder
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"cannot fetch {job.what}: cannot create the cache folder {folder}: {exc}") from exc
    refetch = f"; fetch it again with `elmo-fast models fetch {job.spec} --force`"
    records = []
    try:
        for w in files:
            path = folder / w.name
            if path.is_file() and not force:
                found = file_record(w.role, path, folder, FOUND)
                if w.sha256 is None or found.sha256 == w.sha256:  # a pinned file is kept only if it matches
                    records.append(found)
                    continue
            got = download(
                w.url,
                path,
                job.what,
                progress=progress,
                timeout=timeout,
                offline_hint=job.offline_hint,
                expected_sha256=w.sha256,
                refetch="" if w.sha256 is None else refetch,
                bar=job.bar,
            )
            records.append(file_record(w.role, path, folder, w.url, (got.size, got.sha256)))
    except BaseException:
        if created:
            try:
                folder.rmdir()  # only succeeds if nothing landed there
            except OSError:
                pass
        raise
    return write_record(new_record(job.spec, job.source, "bilm-tf", records, folder))
