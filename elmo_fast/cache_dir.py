"""The one cache directory of elmo-fast: downloaded models, the CPU calibration, anything kept between runs.

``$ELMO_FAST_CACHE`` if set and non-empty, else ``~/.cache/elmo_fast``. Every room that keeps files between
runs asks here (it imports nothing of the package), so moving the cache is one variable for all of them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``$ELMO_FAST_CACHE`` if set and non-empty, else ``~/.cache/elmo_fast``."""
    return Path(os.environ.get("ELMO_FAST_CACHE") or "~/.cache/elmo_fast").expanduser()
