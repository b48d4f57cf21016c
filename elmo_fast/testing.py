"""Deprecated name of :mod:`elmo_fast.formats.random_models` (random-weight models, what
``elmo-fast random-model`` writes), kept for code that imports it from here, as examples once did."""

from __future__ import annotations

import warnings

from .formats.random_models import (  # noqa: F401
    MANYLANGS_CHARS,
    MANYLANGS_PRESETS,
    MANYLANGS_SPECIAL_CHARS,
    MANYLANGS_SPECIAL_WORDS,
    PRESETS,
    random_manylangs_model,
    random_manylangs_weights,
    random_model,
    random_weights,
    random_words,
    write_model,
)

__all__ = [
    "MANYLANGS_CHARS",
    "MANYLANGS_PRESETS",
    "MANYLANGS_SPECIAL_CHARS",
    "MANYLANGS_SPECIAL_WORDS",
    "PRESETS",
    "random_manylangs_model",
    "random_manylangs_weights",
    "random_model",
    "random_weights",
    "random_words",
    "write_model",
]

warnings.warn(
    "elmo_fast.testing is deprecated: import elmo_fast.formats.random_models instead", DeprecationWarning, stacklevel=2
)
