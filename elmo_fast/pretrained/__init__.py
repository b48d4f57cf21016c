"""Models by name: the model bundled in the package (``default``, offline:
:mod:`elmo_fast.pretrained.bundled`), the official allennlp/bilm-tf ELMo models
(:mod:`elmo_fast.pretrained.official`), models on the Hugging Face Hub (``hf:OWNER/REPO``:
:mod:`elmo_fast.pretrained.hf_hub`) and by pinned URL (``URL#sha256=HEX``:
:mod:`elmo_fast.pretrained.url_model`), fetched once into a local cache and checked against the record
kept beside them (:mod:`elmo_fast.pretrained.records`). :func:`fetch` takes any of these names."""

from __future__ import annotations

import os
from pathlib import Path

from . import official
from .bundled import BUNDLED, BundledModel, ModelInfo, bundled_model
from .bundled import DESCRIPTIONS as BUNDLED_DESCRIPTIONS
from .bundled import NAME as BUNDLED_NAME
from .bundled import model_info as bundled_model_info
from .fetch import LocalModel, fetch
from .official import DEFAULT_BASE_URL, MODELS, cache_dir, model_urls
from .spec import parse_model_spec

#: name -> one-line description, the bundled model first
MODEL_DESCRIPTIONS: dict[str, str] = {**BUNDLED_DESCRIPTIONS, **official.MODEL_DESCRIPTIONS}


def model_names() -> list[str]:
    """The names ``--model`` and :func:`fetch_model` accept: the bundled ones (``default`` first), then the
    official ones."""
    return [*BUNDLED, *official.model_names()]


def fetch_model(
    name: str, cache: str | os.PathLike[str] | None = None, progress: bool = True, timeout: float = 30
) -> tuple[Path, Path]:
    """``(options_path, weights_path)`` of the bilm-tf model ``name`` names: the bundled files for
    ``default``, an official model's, ``hf:OWNER/REPO[@REVISION][/SUBFOLDER]``'s, ``URL#sha256=HEX``'s,
    fetched once into the cache (see :func:`fetch`, which also takes ELMoForManyLangs models)."""
    return fetch(name, cache=cache, progress=progress, timeout=timeout).bilm_tf_files()


__all__ = [
    "BUNDLED_NAME",
    "BundledModel",
    "DEFAULT_BASE_URL",
    "MODELS",
    "MODEL_DESCRIPTIONS",
    "LocalModel",
    "ModelInfo",
    "fetch",
    "parse_model_spec",
    "bundled_model",
    "bundled_model_info",
    "cache_dir",
    "fetch_model",
    "model_names",
    "model_urls",
]
