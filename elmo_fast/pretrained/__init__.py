"""Models by name: the model bundled in the package (``default``, offline:
:mod:`elmo_fast.pretrained.bundled`) and the official allennlp/bilm-tf ELMo models, fetched once
into a local cache (:mod:`elmo_fast.pretrained.official`)."""

from __future__ import annotations

import os
from pathlib import Path

from . import official
from .bundled import DESCRIPTION as BUNDLED_DESCRIPTION
from .bundled import NAME as BUNDLED_NAME
from .bundled import BundledModel, bundled_model
from .official import DEFAULT_BASE_URL, MODELS, cache_dir, model_urls

#: name -> one-line description, the bundled model first
MODEL_DESCRIPTIONS: dict[str, str] = {BUNDLED_NAME: BUNDLED_DESCRIPTION, **official.MODEL_DESCRIPTIONS}


def model_names() -> list[str]:
    """The names ``--model`` and :func:`fetch_model` accept: ``default`` (bundled), then the official ones."""
    return [BUNDLED_NAME, *official.model_names()]


def fetch_model(
    name: str, cache: str | os.PathLike[str] | None = None, progress: bool = True, timeout: float = 30
) -> tuple[Path, Path]:
    """``(options_path, weights_path)`` of model ``name``: the bundled files for ``default``, else
    the official model, downloaded once into the cache (see :func:`official.fetch_model`)."""
    if name == BUNDLED_NAME:
        files = bundled_model()
        return files.options, files.weights
    return official.fetch_model(name, cache=cache, progress=progress, timeout=timeout)


__all__ = [
    "BUNDLED_NAME",
    "BundledModel",
    "DEFAULT_BASE_URL",
    "MODELS",
    "MODEL_DESCRIPTIONS",
    "bundled_model",
    "cache_dir",
    "fetch_model",
    "model_names",
    "model_urls",
]
