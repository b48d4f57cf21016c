"""Fetch the official ELMo models by name, downloading each file once into a local cache.

``fetch_model("small")`` returns ``(options_path, weights_path)`` under
``cache_dir()/small/``. Files already in the cache are used without any request (their sizes checked
against the record kept beside them, :mod:`.records`). A download is written through
:mod:`elmo_fast.durable`: to a temporary file in the same directory, fsync'ed and renamed only once
complete, so the final path never holds a partial file; two processes fetching one model download it
once (:mod:`.fetch_lock`).

Environment:

* ``ELMO_FAST_CACHE``: the cache directory (default ``~/.cache/elmo_fast``).
* ``ELMO_FAST_BASE_URL``: where the models live (default :data:`DEFAULT_BASE_URL`); the
  relative paths in :data:`MODELS` are appended to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..cache_dir import cache_dir
from ..errors import DownloadError, ElmoFastError
from .cached_download import Fetch, Wanted, fetch_files
from .http_download import download

__all__ = [
    "DEFAULT_BASE_URL",
    "MODELS",
    "MODEL_DESCRIPTIONS",
    "cache_dir",
    "cached_files",
    "fetch_file",
    "fetch_model",
    "model_for_url",
    "model_names",
    "model_urls",
]

DEFAULT_BASE_URL = "https://allennlp.s3.amazonaws.com/models/elmo"

OPTIONS_FILENAME = "options.json"
WEIGHTS_FILENAME = "weights.hdf5"


def _paths(directory: str, stem: str) -> tuple[str, str]:
    return (f"{directory}/{stem}_options.json", f"{directory}/{stem}_weights.hdf5")


#: name -> (options path, weights path), both relative to the base URL.
MODELS: dict[str, tuple[str, str]] = {
    "small": _paths("2x1024_128_2048cnn_1xhighway", "elmo_2x1024_128_2048cnn_1xhighway"),
    "medium": _paths("2x2048_256_2048cnn_1xhighway", "elmo_2x2048_256_2048cnn_1xhighway"),
    "original": _paths("2x4096_512_2048cnn_2xhighway", "elmo_2x4096_512_2048cnn_2xhighway"),
    "original-5.5b": _paths("2x4096_512_2048cnn_2xhighway_5.5B", "elmo_2x4096_512_2048cnn_2xhighway_5.5B"),
    # contributed models that allennlp hosts beside them (flair's ELMoEmbeddings names both)
    "pt": ("contributed/pt/elmo_pt_options.json", "contributed/pt/elmo_pt_weights.hdf5"),
    "pubmed": (
        "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_options.json",
        "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_weights_PubMed_only.hdf5",
    ),
}

#: where allennlp, flair and their users have linked these files from: the host and the path before
#: MODELS' relative paths (https://allennlp.s3.amazonaws.com/models/elmo/... and the older
#: https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/..., over http or https)
KNOWN_LOCATIONS: tuple[tuple[str, str], ...] = (
    ("allennlp.s3.amazonaws.com", "/models/elmo/"),
    ("s3-us-west-2.amazonaws.com", "/allennlp/models/elmo/"),
    ("s3.us-west-2.amazonaws.com", "/allennlp/models/elmo/"),
    ("allennlp.s3.us-west-2.amazonaws.com", "/models/elmo/"),
)

#: name -> one-line description (for ``--help`` and listings).
MODEL_DESCRIPTIONS: dict[str, str] = {
    "small": "13.6M params, LSTM 2x1024, output dim 256 (weights ~55 MB)",
    "medium": "28.0M params, LSTM 2x2048, output dim 512 (weights ~110 MB)",
    "original": "93.6M params, LSTM 2x4096, output dim 1024 (weights ~375 MB)",
    "original-5.5b": "93.6M params, as 'original', trained on 5.5B tokens (weights ~375 MB)",
    "pt": "contributed: Portuguese (allennlp's contributed/pt model)",
    "pubmed": "contributed: as 'original', trained on PubMed (allennlp's contributed/pubmed model)",
}


def model_for_url(url: str) -> tuple[str, str] | None:
    """``(name, "options" | "weights")`` for the URL of an official model's file as allennlp, flair and
    their users wrote it (any of :data:`KNOWN_LOCATIONS`), else None."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    for host, prefix in KNOWN_LOCATIONS:
        if parts.netloc.lower() == host and parts.path.startswith(prefix):
            relative = parts.path[len(prefix) :]
            for name, files in MODELS.items():
                for role, path in zip(("options", "weights"), files):
                    if relative == path:
                        return name, role
    return None


def cached_files(name: str, cache: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """Where :func:`fetch_model` keeps model ``name``'s options and weights (whether there or not)."""
    _check_name(name)
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    return root / name / OPTIONS_FILENAME, root / name / WEIGHTS_FILENAME


def model_names() -> list[str]:
    """The names :func:`fetch_model` accepts, in a stable order."""
    return list(MODELS)


def base_url() -> str:
    """``$ELMO_FAST_BASE_URL`` if set and non-empty, else :data:`DEFAULT_BASE_URL`."""
    return (os.environ.get("ELMO_FAST_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def _check_name(name: str) -> None:
    if name not in MODELS:
        raise ElmoFastError(f"unknown ELMo model {name!r}; valid names: {', '.join(model_names())}")


def model_urls(name: str) -> tuple[str, str]:
    """The (options URL, weights URL) of model ``name`` under the current base URL."""
    _check_name(name)
    base = base_url()
    options, weights = MODELS[name]
    return f"{base}/{options}", f"{base}/{weights}"


def _offline_hint(model_dir: Path) -> str:
    return (
        "This machine seems to be offline (or the server cannot be reached). To proceed "
        "without downloading, pass local files with `--options F --weights F`, or put the "
        f"model's files into the cache as {model_dir / OPTIONS_FILENAME} and "
        f"{model_dir / WEIGHTS_FILENAME}."
    )


def fetch_model(
    name: str,
    cache: str | os.PathLike[str] | None = None,
    progress: bool = True,
    timeout: float = 30,
    force: bool = False,
) -> tuple[Path, Path]:
    """Return ``(options_path, weights_path)`` of model ``name``, downloading what is missing.

    ``cache`` overrides :func:`cache_dir`; files go to ``<cache>/<name>/options.json`` and
    ``<cache>/<name>/weights.hdf5``, their record (size, SHA-256, URL) to ``<cache>/<name>/record.json``
    (:mod:`.records`): each load checks the sizes, the first after a download the digests too.
    ``timeout`` (seconds) applies to connecting and to each read; ``force`` downloads the files again.
    Raises :class:`ElmoFastError` for an unknown name, :class:`DownloadError` when a file cannot be
    fetched (HTTP error, truncated response, network failure) and :class:`ModelFileError` for a cached
    file that no longer matches its record.
    """
    options_url, weights_url = model_urls(name)
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    model_dir = root / name
    job = Fetch(
        spec=name,
        source={"kind": "s3", "name": name, "base_url": base_url()},
        what=f"ELMo model {name!r}",
        bar=name,
        folder=model_dir,
        lock_root=root,
        lock_key=f"official-{name}",
        offline_hint=_offline_hint(model_dir),
    )
    files = [
        Wanted("options", options_url, OPTIONS_FILENAME),
        Wanted("weights", weights_url, WEIGHTS_FILENAME),
    ]
    record = fetch_files(job, files, progress=progress, timeout=timeout, force=force)
    paths = record.paths()
    return paths["options"], paths["weights"]


def fetch_file(url: str, path: str | os.PathLike[str], label: str, progress: bool = True, timeout: float = 30) -> Path:
    """``path``, downloaded from ``url`` first when it is not there (through the durable write path:
    never a partial file under that name); ``label`` names it in messages and the progress bar.
    Raises :class:`DownloadError` as :func:`fetch_model` does."""
    path = Path(path)
    if path.is_file():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"cannot fetch {url}: cannot create the cache directory {path.parent}: {exc}") from exc
    download(
        url,
        path,
        label,
        progress=progress,
        timeout=timeout,
        offline_hint="This machine seems to be offline (or the server cannot be reached).",
    )
    return path
