"""Model directories: which kind of model a directory holds, its files, and its weights.

* bilm-tf (allennlp's and TF-Hub's models, and those trained here): ``options.json`` + ``weights.hdf5``
  (or the one ``*.hdf5`` besides ``softmax.hdf5``, as ``elmo-fast train`` leaves it);
* ELMoForManyLangs: ``config.json`` (+ the config it names), ``char.dic``, ``word.dic``,
  ``token_embedder.pkl``, ``encoder.pkl`` (:mod:`~elmo_fast.formats.manylangs_dir`).

A directory that is neither gives one line naming what is missing. A directory that holds both is
an error asking which to load (``model_format``, the CLI's ``--model-format``): a silent guess could
embed with the other model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, ModelFileError, Param
from . import manylangs_dir
from .bilm_tf import ElmoWeights, load_model_files, save_model_files

BILM_TF = "bilm-tf"
MANYLANGS = "ELMoForManyLangs"

#: what ``model_format`` takes (lower case; any case is accepted), and the kind each one loads
MODEL_FORMATS = {"bilm-tf": BILM_TF, "elmoformanylangs": MANYLANGS}

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


def check_model_format(model_format: str | None) -> str | None:
    """The kind (:data:`BILM_TF` or :data:`MANYLANGS`) a ``model_format`` names; None for None."""
    if model_format is None:
        return None
    kind = MODEL_FORMATS.get(model_format.lower()) if isinstance(model_format, str) else None
    if kind is None:
        raise ModelFileError(Param("model_format"), f" must be one of {', '.join(MODEL_FORMATS)}, got {model_format!r}")
    return kind


def inspect_model_dir(path: str | os.PathLike, model_format: str | None = None) -> ModelDir:
    """Which kind of model ``path`` holds, and its files; a :class:`ModelFileError` naming the
    missing file when it is neither kind, or asking for ``model_format`` when it holds both.
    model_format: "bilm-tf" or "elmoformanylangs", to load that one (its files must be there)."""
    kind = check_model_format(model_format)
    d = Path(path)
    if not d.exists():
        raise ModelFileError(f"{d}: model directory not found")
    if not d.is_dir():
        raise ModelFileError(
            f"{d}: not a directory (a model directory holds {_BILM_TF_FILES} for bilm-tf models, "
            f"or {_MANYLANGS_FILES} for ELMoForManyLangs models)"
        )
    has = {
        name: (d / name).is_file()
        for name in (
            "options.json",
            manylangs_dir.CONFIG_FILE,
            manylangs_dir.TOKEN_EMBEDDER_PKL,
            manylangs_dir.ENCODER_PKL,
        )
    }
    pickles = has[manylangs_dir.TOKEN_EMBEDDER_PKL] or has[manylangs_dir.ENCODER_PKL]
    weights = _bilm_tf_weights(d)
    if kind == MANYLANGS:
        if not has[manylangs_dir.CONFIG_FILE]:
            _raise_missing(d, manylangs_dir.CONFIG_FILE, MANYLANGS)
        return _manylangs_model_dir(d)
    if kind == BILM_TF:
        return _bilm_tf_model_dir(d, has["options.json"], weights)
    if has[manylangs_dir.CONFIG_FILE] and pickles and has["options.json"] and weights is not None:
        raise ModelFileError(
            f"{d} holds both a bilm-tf model ({_BILM_TF_FILES}) and an ELMoForManyLangs model "
            f"(config.json, token_embedder.pkl, encoder.pkl): say which to load with ",
            Param("model_format", "bilm-tf"),
            " or ",
            Param("model_format", "elmoformanylangs"),
        )
    if has[manylangs_dir.CONFIG_FILE] and (pickles or not has["options.json"]):
        return _manylangs_model_dir(d)
    if has["options.json"] or weights is not None:
        return _bilm_tf_model_dir(d, has["options.json"], weights)
    if pickles:
        _raise_missing(d, manylangs_dir.CONFIG_FILE, MANYLANGS)
    raise ModelFileError(
        f"{d}: not a model directory: it holds neither {_BILM_TF_FILES} (bilm-tf, allennlp) nor "
        f"{_MANYLANGS_FILES} (ELMoForManyLangs)"
    )


def _bilm_tf_model_dir(d: Path, has_options: bool, weights: Path | None) -> ModelDir:
    if not has_options:
        _raise_missing(d, "options.json", BILM_TF)
    if weights is None:
        _raise_missing(d, "weights.hdf5", BILM_TF)
    return ModelDir(BILM_TF, d, {"options": d / "options.json", "weights": weights})


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


def load_model_dir(
    path: str | os.PathLike, model_format: str | None = None
) -> ElmoWeights | manylangs_dir.ManyLangsWeights:
    """The weights of a model directory of either kind, checked (see :func:`inspect_model_dir`)."""
    model = inspect_model_dir(path, model_format)
    return load_model(model)


def save_model_dir(
    directory: str | os.PathLike, weights: ElmoWeights | manylangs_dir.ManyLangsWeights
) -> tuple[str, str]:
    """Write ``weights`` as a model directory of their own kind into ``directory`` (made if need be),
    each file replaced atomically: bilm-tf's ``options.json`` + ``weights.hdf5`` (returned), or
    ELMoForManyLangs' layout (config.json, its config, the dictionaries, token_embedder.pkl and
    encoder.pkl; the paths of config.json and encoder.pkl returned)."""
    os.makedirs(directory, exist_ok=True)
    if isinstance(weights, manylangs_dir.ManyLangsWeights):
        saved = manylangs_dir.save_manylangs(directory, weights)
        return os.path.join(saved, manylangs_dir.CONFIG_FILE), os.path.join(saved, manylangs_dir.ENCODER_PKL)
    options, weights_path = os.path.join(directory, "options.json"), os.path.join(directory, "weights.hdf5")
    save_model_files(options, weights_path, weights)
    return options, weights_path


def load_model(model: ModelDir) -> ElmoWeights | manylangs_dir.ManyLangsWeights:
    if model.kind == BILM_TF:
        return load_model_files(model.files["options"], model.files["weights"])
    return manylangs_dir.load_manylangs(model.path)


def model_dir_files(directory: str | os.PathLike, param: str = "model_dir") -> tuple[Path, Path]:
    """options.json and weights.hdf5 of a bilm-tf model directory (the one ``*.hdf5`` besides
    ``softmax.hdf5`` where there is no weights.hdf5), as training and scoring need them; ``param``:
    the parameter that named it, for errors."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(Param(param), f" {d}: not a directory")
    options = d / "options.json"
    weights = _bilm_tf_weights(d) or d / "weights.hdf5"
    missing = [p.name for p in (options, weights) if not p.exists()]
    if missing and (d / manylangs_dir.CONFIG_FILE).is_file() and (d / manylangs_dir.ENCODER_PKL).is_file():
        raise InputError(
            Param(param),
            f" {d}: an ELMoForManyLangs model, which has no bilm-tf softmax (options.json, "
            f"weights.hdf5, softmax.hdf5) to train or score with; `elmo-fast embed --model-dir` embeds "
            f"with it, and Elmo(dir, requires_grad=True) fine-tunes it under a downstream loss",
        )
    if missing:
        raise InputError(
            Param(param),
            f" {d}: missing {' and '.join(missing)} (a model directory holds options.json and weights.hdf5)",
        )
    return options, weights
