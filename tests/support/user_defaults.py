"""What a process runs when nothing is chosen, read from the package itself: the effective defaults that
docs/precision-and-speed.md ("The defaults") lists and tests/docs/test_suite_defaults.py compares between the
test suite and a user's process. ``python user_defaults.py`` prints them as JSON."""

from __future__ import annotations

import inspect
import json
import os

#: variables that say where files are, or which of the tests' own cases run: not what the package does
NOT_BEHAVIOUR = {
    "ELMO_FAST_CACHE",  # where files are kept (the suite's own folder, as every user has one)
    "ELMO_FAST_FIXTURE_DIR",  # where the tests read the golden fixture
    "ELMO_FAST_CUDA_EMULATION",  # which emulated CUDA cases the tests run
    "ELMO_FAST_EMULATION_TSAN",
    "ELMO_FAST_EMULATION_SCHEDULE",
}


def effective_defaults() -> dict:
    from elmo_fast import ElmoBiLm, ElmoEmbedder
    from elmo_fast.bilm.backends import resolve_backend
    from elmo_fast.bilm.precision import resolve_precision
    from elmo_fast.compat.allennlp09.settings import model_settings
    from elmo_fast.tuning import environment
    from elmo_fast.verification import first_use

    stateful = {inspect.signature(cls).parameters["stateful"].default for cls in (ElmoBiLm, ElmoEmbedder)}
    return {
        "backend": resolve_backend(inspect.signature(ElmoBiLm).parameters["backend"].default),
        "precision": resolve_precision(None, None).name,
        "state mode": "stateful" if stateful == {True} else "stateless" if stateful == {False} else repr(stateful),
        "CPU calibration": environment.mode(),
        "first-use self-check": first_use.mode(),
        # the allennlp import path's own settings (ELMO_FAST_PRECISION, ELMO_FAST_BACKEND): none by default
        "allennlp import path settings": repr(model_settings()),
        "variables set": sorted(k for k in os.environ if k.startswith("ELMO_FAST_") and k not in NOT_BEHAVIOUR),
    }


if __name__ == "__main__":
    print(json.dumps(effective_defaults()))
