"""``allennlp.common.file_utils.cached_path``: what flair, allennlp's ``DEFAULT_*_FILE`` and
allennlp-0.9-era code pass as model files (local paths, or URLs of the official models) made local.

A URL of an official model (allennlp's S3 addresses, old and new, of original, small, medium, 5.5B,
pt and pubmed: :func:`elmo_fast.pretrained.official.model_for_url`) is that model in elmo-fast's
cache (``elmo-fast models list`` shows it; ``ELMO_FAST_CACHE`` moves it), its files checked against
the record kept beside them (:mod:`elmo_fast.pretrained.records`). When it is not there yet, a
copy that allennlp itself downloaded earlier is used as it is (``~/.allennlp/cache``, or
``ALLENNLP_CACHE_ROOT``); failing that, the model is downloaded once into elmo-fast's cache. Any
other URL is looked for in allennlp's cache, then downloaded once into elmo-fast's cache. Offline,
the error names the file and where to put it. Local paths are returned as they are.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import DownloadError
from ...pretrained import official

#: allennlp's cache, where allennlp 0.9 downloaded URLs to (``ALLENNLP_CACHE_ROOT`` moves it)
CACHE_ROOT = Path(os.getenv("ALLENNLP_CACHE_ROOT", Path.home() / ".allennlp"))
CACHE_DIRECTORY = str(CACHE_ROOT / "cache")


def url_to_filename(url: str, etag: str | None = None) -> str:
    """allennlp's name for a URL's file in its cache: the URL's SHA-256, then the ETag's."""
    name = hashlib.sha256(url.encode("utf-8")).hexdigest()
    if etag:
        name += "." + hashlib.sha256(etag.encode("utf-8")).hexdigest()
    return name


def _in_allennlp_cache(url: str, cache_dir: str | os.PathLike | None) -> str | None:
    """The newest file allennlp downloaded ``url`` to, if any (its .json metadata and locks aside)."""
    folder = Path(cache_dir if cache_dir is not None else CACHE_DIRECTORY).expanduser()
    stem = url_to_filename(url)
    try:
        found = [
            p
            for p in folder.iterdir()
            if (p.name == stem or p.name.startswith(stem + "."))
            and not p.name.endswith((".json", ".lock"))
            and p.is_file()
        ]
    except OSError:
        return None
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def _official(url: str, name: str, role: str, cache_dir) -> str:
    options, weights = official.cached_files(name)
    target = options if role == "options" else weights
    if options.is_file() and weights.is_file():  # cached: no request, the files checked against their record
        fetched = official.fetch_model(name, progress=False)
        return str(fetched[0] if role == "options" else fetched[1])
    if target.is_file():
        return str(target)
    if (earlier := _in_allennlp_cache(url, cache_dir)) is not None:
        return earlier
    try:
        fetched = official.fetch_model(name)
    except DownloadError as e:
        reason = str(e).split(". This machine seems", 1)[0]
        raise DownloadError(
            f"{url}: the {role} file of ELMo model {name!r} is not in elmo-fast's cache and cannot "
            f"be downloaded ({reason}); offline, put the model's files at {options} and {weights} "
            f"(or pass local paths)"
        ) from None
    return str(fetched[0] if role == "options" else fetched[1])


def _other_url(url: str, cache_dir) -> str:
    if (earlier := _in_allennlp_cache(url, cache_dir)) is not None:
        return earlier
    basename = os.path.basename(urlsplit(url).path) or "file"
    target = official.cache_dir() / "urls" / f"{url_to_filename(url)[:16]}-{basename}"
    try:
        return str(official.fetch_file(url, target, basename))
    except DownloadError as e:
        raise DownloadError(
            f"{url}: not in elmo-fast's cache and cannot be downloaded ({e}); offline, put the "
            f"file at {target} (or pass a local path)"
        ) from None


def cached_path(url_or_filename: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """A local path for ``url_or_filename`` (see the module docstring); a local file that does not
    exist is a FileNotFoundError, as in allennlp. ``cache_dir``: allennlp's cache to look in."""
    text = os.path.expanduser(os.fspath(url_or_filename))
    scheme = urlsplit(text).scheme
    if scheme in ("http", "https"):
        known = official.model_for_url(text)
        return _official(text, *known, cache_dir) if known else _other_url(text, cache_dir)
    if scheme == "s3":
        if (earlier := _in_allennlp_cache(text, cache_dir)) is not None:
            return earlier
        raise DownloadError(
            f"{text}: elmo-fast does not read s3:// addresses; download the file and pass its local path"
        )
    if os.path.exists(text):
        return text
    if scheme in ("", "file") or len(scheme) == 1:  # a path (a drive letter on Windows)
        raise FileNotFoundError(f"file {text} not found")
    raise ValueError(f"unable to parse {text} as a URL or as a local path")
