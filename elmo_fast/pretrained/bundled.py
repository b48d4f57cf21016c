"""The model shipped inside the package: an English biLM trained by elmo-fast itself (its
MODEL_CARD.md says on what and how), used whenever no model is named, offline."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError

NAME = "default"
DIRECTORY = Path(__file__).resolve().parent / NAME
DESCRIPTION = (
    "elmo-fast's own English biLM, bundled and offline (2x256_96 LSTM, 256 char filters, output "
    "dim 192; see elmo_fast/pretrained/default/MODEL_CARD.md)"
)


#: what a command prints (one line, stderr) when no model was named and it uses this one
USING_MESSAGE = (
    f"elmo-fast: no model named: using the bundled model '{NAME}' (elmo-fast's own small English biLM, "
    "offline); --model original gives the official ELMo where the internet is reachable"
)


@dataclass(frozen=True)
class BundledModel:
    options: Path
    weights: Path
    softmax: Path
    vocab: Path

    @property
    def directory(self) -> Path:
        return self.options.parent


def bundled_model() -> BundledModel:
    """The bundled model's files; a one-line error naming what is missing from this install."""
    files = BundledModel(
        DIRECTORY / "options.json", DIRECTORY / "weights.hdf5", DIRECTORY / "softmax.hdf5", DIRECTORY / "vocab.txt"
    )
    missing = [p.name for p in (files.options, files.weights, files.softmax, files.vocab) if not p.is_file()]
    if missing:
        raise ModelFileError(
            f"the bundled model is missing {', '.join(missing)} in {DIRECTORY} (an install without "
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
