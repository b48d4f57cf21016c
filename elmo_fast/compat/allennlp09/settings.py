"""What the stand-in's classes take from the environment, since the code that builds them (flair,
seqvec, bio_embeddings) cannot be given elmo-fast's arguments:

* ``ELMO_FAST_PRECISION``: the fast path's arithmetic for every biLM the stand-in builds (fp32 by
  default, as allennlp; bf16 trades a stated bound for speed: :mod:`elmo_fast.bilm.precision`).
* ``ELMO_FAST_BACKEND``: ``auto`` (default), ``fast`` or ``reference``.

A bad value is a one-line error naming the variable, at the first model built.
"""

from __future__ import annotations

import os

from ...errors import ElmoFastError

PRECISION_VAR = "ELMO_FAST_PRECISION"
BACKEND_VAR = "ELMO_FAST_BACKEND"


def model_settings() -> dict:
    """Keyword arguments for the core's constructors (``precision``, ``backend``) from the environment."""
    settings: dict = {}
    precision = os.environ.get(PRECISION_VAR, "").strip()
    if precision:
        from ...bilm.precision import resolve_precision

        try:
            settings["precision"] = resolve_precision(precision, None)
        except ElmoFastError as e:
            raise ElmoFastError(f"{PRECISION_VAR}={precision!r}: {e}") from None
    backend = os.environ.get(BACKEND_VAR, "").strip()
    if backend:
        from ...bilm.backends import BACKENDS

        if backend not in BACKENDS:
            raise ElmoFastError(f"{BACKEND_VAR}={backend!r}: must be one of {', '.join(BACKENDS)}")
        settings["backend"] = backend
    return settings
