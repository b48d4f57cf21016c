"""The models shipped inside the package, offline: English biLMs trained by elmo-fast itself (each
MODEL_CARD.md says on what and how). ``default`` is used whenever no model is named; ``default-v1``,
the previous default, stays available by name for vectors that must match what it gave.

Their licence terms are not the code's: MODEL_INFO.json beside each model's weights holds them (read by
:func:`model_info`; ``elmo-fast --version``, ``elmo-fast doctor`` and the server show them).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError

NAME = "default"
_HERE = Path(__file__).resolve().parent

#: every bundled model: name -> its folder in the package
BUNDLED: dict[str, Path] = {NAME: _HERE / "default", "default-v1": _HERE / "default-v1"}

#: name -> one line, for ``--model``'s help and ``elmo-fast models``
DESCRIPTIONS: dict[str, str] = {
    NAME: (
        "elmo-fast's own English biLM, bundled and offline, trained on permissively licensed and public-domain "
        "text (2x256_96 LSTM, 256 char filters, output dim 192; elmo_fast/pretrained/default/MODEL_CARD.md)"
    ),
    "default-v1": (
        "the previous bundled default (the same shape, trained partly on GPL and GFDL text; "
        "elmo_fast/pretrained/default-v1/MODEL_CARD.md), for vectors that must match it"
    ),
}

DIRECTORY = BUNDLED[NAME]
DESCRIPTION = DESCRIPTIONS[NAME]


def bundled_name(directory: str | Path) -> str | None:
    """The bundled model whose folder ``directory`` is, or None."""
    resolved = Path(directory).resolve()
    return next((name for name, folder in BUNDLED.items() if folder == resolved), None)


#: what a command prints (one line, stderr) when no model was named and it uses this one
USING_MESSAGE = (
    f"elmo-fast: no model named: using the bundled model '{NAME}' (elmo-fast's own small English biLM, "
    "offline); --model original gives the official ELMo where the internet is reachable"
)


#: beside the weights: the model's licence terms (``license``: one line for people; ``permissive``: whether
#: the weights may be redistributed under permissive terms; ``copyleft_training_text``: the SPDX ids of the
#: copyleft licences of its training text; ``model_card``: the card's file name)
INFO_FILE = "MODEL_INFO.json"


@dataclass(frozen=True)
class ModelInfo:
    """A bundled model's terms, as its MODEL_INFO.json states them."""

    name: str
    license: str
    permissive: bool
    copyleft_training_text: tuple[str, ...]
    model_card: Path

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "license": self.license,
            "permissive": self.permissive,
            "copyleft_training_text": list(self.copyleft_training_text),
            "model_card": str(self.model_card),
        }


def model_info(directory: Path | None = None, name: str = NAME) -> ModelInfo:
    """The terms of the bundled model ``name`` (in ``directory``, by default its folder in the package); a
    one-line :class:`ModelFileError` when its MODEL_INFO.json is missing or malformed."""
    directory = BUNDLED[name] if directory is None else Path(directory)
    path = directory / INFO_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ModelInfo(
            name=name,
            license=str(data["license"]),
            permissive=bool(data["permissive"]),
            copyleft_training_text=tuple(data.get("copyleft_training_text", ())),
            model_card=directory / data.get("model_card", "MODEL_CARD.md"),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelFileError(
            f"{path}: the bundled model's terms cannot be read ({type(e).__name__}: {e}); reinstall elmo-fast"
        ) from None


def license_line() -> str:
    """One line for ``--version`` and ``doctor``: the bundled model and its licence terms (never raises)."""
    try:
        info = model_info()
    except ModelFileError as e:
        return f"bundled model '{NAME}': {e}"
    return f"bundled model '{NAME}': {info.license}; {info.model_card}"


@dataclass(frozen=True)
class BundledModel:
    options: Path
    weights: Path
    softmax: Path
    vocab: Path

    @property
    def directory(self) -> Path:
        return self.options.parent


def bundled_model(name: str = NAME) -> BundledModel:
    """The files of the bundled model ``name``; a one-line error naming what is missing from this install."""
    if name not in BUNDLED:
        raise ModelFileError(f"no bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    folder = BUNDLED[name]
    files = BundledModel(
        folder / "options.json", folder / "weights.hdf5", folder / "softmax.hdf5", folder / "vocab.txt"
    )
    missing = [p.name for p in (files.options, files.weights, files.softmax, files.vocab) if not p.is_file()]
    if missing:
        raise ModelFileError(
            f"the bundled model '{name}' is missing {', '.join(missing)} in {folder} (an install without "
            "package data?): reinstall elmo-fast, or name a model with --options/--weights, "
            "--model-dir or --model"
        )
    return files


def default_model_dir() -> Path:
    """The bundled model's directory, for constructors given no model; says so in one line (a
    warning of the ``elmo_fast`` logger: stderr unless logging is configured otherwise)."""
    files = bundled_model()
    logging.getLogger("elmo_fast").warning(USING_MESSAGE.removeprefix("elmo-fast: "))
    return files.directory
