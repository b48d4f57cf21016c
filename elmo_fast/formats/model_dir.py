"""Model directories: which kind of model a directory holds, its files, and its weights.

* bilm-tf (allennlp's and TF-Hub's models, and those trained here): ``options.json`` + ``weights.hdf5``
  (or the one ``*.hdf5`` besides ``softmax.hdf5``, as ``elmo-fast train`` leaves it);
* ELMoForManyLangs: ``config.json`` (+ the config it names), ``char.dic``, ``word.dic``,
  ``token_embedder.pkl``, ``encoder.pkl`` (:mod:`~elmo_fast.formats.manylangs_dir`).

A directory that is neither gives one line naming what is missing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError
from . import manylangs_dir
from .bilm_tf import ElmoWeights, load_model_files

BILM_TF = "bilm-tf"
MANYLANGS = "ELMoForManyLangs"

_BILM_TF_FILES = "options.json and weights.hdf5"
_MANYLANGS_FILES = "config.json, char.dic, word.dic, token_embedder.pkl and encoder.pkl"


@dataclass(frozen=True)
class ModelDir:
    """A model directory: its kind (:data:`BILM_TF` or :data:`MANYLANGS`) and the files that
    define the model, by role (what a resumed run checks has not changed)."""

    kind: str
    path: Path
    files: dict[str, Path]


def _bilm_tf_weights(d: Path) -> Path | None:
    weights = d / "weights.hdf5"
    if weights.is_file():
        return weights
    candidates = sorted(p for p in d.glob("*.hdf5") if p.name != "softmax.hdf5" and p.is_file())
    return candidates[0] if len(candidates) == 1 else None


def inspect_model_dir(path: str | os.PathLike) -> ModelDir:
    """Which kind of model ``path`` holds, and its files; a :class:`ModelFileError` naming the
    missing file when it is neither kind."""
    d = Path(path)
    if not d.exists():
        raise ModelFileError(f"{d}: model directory not found")
    if not d.is_dir():
        raise ModelFileError(f"{d}: not a directory (a model directory holds {_BILM_TF_FILES} for bilm-tf models, "
                             f"or {_MANYLANGS_FILES} for ELMoForManyLangs models)")
    has = {name: (d / name).is_file() for name in ("options.json", manylangs_dir.CONFIG_FILE,
                                                   manylangs_dir.TOKEN_EMBEDDER_PKL, manylangs_dir.ENCODER_PKL)}
    pickles = has[manylangs_dir.TOKEN_EMBEDDER_PKL] or has[manylangs_dir.ENCODER_PKL]
    weights = _bilm_tf_weights(d)
    if has[manylangs_dir.CONFIG_FILE] and (pickles or not has["options.json"]):
        return _manylangs_model_dir(d)
    if has["options.json"] or weights is not None:
        if not has["options.json"]:
            _raise_missing(d, "options.json", BILM_TF)
        if weights is None:
            _raise_missing(d, "weights.hdf5", BILM_TF)
        return ModelDir(BILM_TF, d, {"options": d / "options.json", "weights": weights})
    if pickles:
        _raise_missing(d, manylangs_dir.CONFIG_FILE, MANYLANGS)
    raise ModelFileError(f"{d}: not a model directory: it holds neither {_BILM_TF_FILES} (bilm-tf, allennlp) nor "
                         f"{_MANYLANGS_FILES} (ELMoForManyLangs)")


def _raise_missing(d: Path, name: str, kind: str) -> None:
    holds, article = (_BILM_TF_FILES, "a") if kind == BILM_TF else (_MANYLANGS_FILES, "an")
    raise ModelFileError(f"{d}: missing {name} ({article} {kind} model directory holds {holds})")


def _manylangs_model_dir(d: Path) -> ModelDir:
    config, config_path = manylangs_dir.load_config(d)
    names = [manylangs_dir.TOKEN_EMBEDDER_PKL, manylangs_dir.ENCODER_PKL]
    names += [manylangs_dir.CHAR_DIC] if config.char_dim else []
    names += [manylangs_dir.WORD_DIC] if config.word_dim else []
    for name in names:
        if not (d / name).is_file():
            _raise_missing(d, name, MANYLANGS)
    files = {manylangs_dir.CONFIG_FILE: d / manylangs_dir.CONFIG_FILE, "config_path": config_path}
    files.update({name: d / name for name in sorted(names)})
    return ModelDir(MANYLANGS, d, files)


def load_model_dir(path: str | os.PathLike) -> ElmoWeights | manylangs_dir.ManyLangsWeights:
    """The weights of a model directory of either kind, checked (see :func:`inspect_model_dir`)."""
    model = inspect_model_dir(path)
    return load_model(model)


def load_model(model: ModelDir) -> ElmoWeights | manylangs_dir.ManyLangsWeights:
    if model.kind == BILM_TF:
        return load_model_files(model.files["options"], model.files["weights"])
    return manylangs_dir.load_manylangs(model.path)
