"""A model by URL, pinned: ``URL#sha256=HEX`` is a folder on a web server holding ``options.json`` and
``weights.hdf5`` (bilm-tf's two files, as ``elmo-fast random-model``, ``convert`` and ``train`` write
them), fetched once into ``<cache>/url/<key>/``; HEX is the weights file's SHA-256, checked as it
arrives: a file that does not match it is not kept. The options file is small and read as JSON, its
digest recorded at download and checked as every cached file's is.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..cache_dir import cache_dir
from .cached_download import Fetch, Wanted, fetch_files
from .records import ModelRecord
from .spec import UrlSpec

OPTIONS_FILENAME = "options.json"
WEIGHTS_FILENAME = "weights.hdf5"


def url_model_folder(spec: UrlSpec, cache: Path | None = None) -> Path:
    """Where the model ``spec`` names is kept: one folder per URL and pin."""
    key = hashlib.sha256(spec.text.encode("utf-8")).hexdigest()[:16]
    return (cache if cache is not None else cache_dir()) / "url" / key


def fetch_url_model(
    spec: UrlSpec, *, progress: bool = True, timeout: float = 30, force: bool = False, cache: Path | None = None
) -> ModelRecord:
    """The record of the model ``spec`` names, its files in the cache and checked."""
    root = cache if cache is not None else cache_dir()
    folder = url_model_folder(spec, root)
    job = Fetch(
        spec=spec.text,
        source={"kind": "url", "url": spec.base_url, "sha256": spec.sha256},
        what=f"the model at {spec.base_url}",
        bar=folder.name,
        folder=folder,
        lock_root=root,
        lock_key=f"url-{folder.name}",
        offline_hint=(
            "This machine seems to be offline (or the server cannot be reached): pass local files with "
            "`--options F --weights F`, or `--model-dir DIR`."
        ),
    )
    files = [
        Wanted("options", f"{spec.base_url}/{OPTIONS_FILENAME}", OPTIONS_FILENAME),
        Wanted("weights", f"{spec.base_url}/{WEIGHTS_FILENAME}", WEIGHTS_FILENAME, spec.sha256),
    ]
    return fetch_files(job, files, progress=progress, timeout=timeout, force=force)
