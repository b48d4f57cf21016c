"""What elmo_fast._C was built against (elmo_fast/_build_info.py, written by setup.py), and why it
does not load when it does not: a missing build reads differently from one that is there but was
built against another torch (torch's C++ ABI changes between releases; a CUDA build of the
extension needs a CUDA torch)."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import torch

REBUILD_HINT = (
    "from a source tree, `pip install --no-build-isolation -e .` (or `pip install .`); from PyPI, "
    "`pip install --force-reinstall --no-deps --no-cache-dir elmo-fast` (pip's cache may hold a wheel "
    "built against the old torch)"
)


def build_info() -> ModuleType | None:
    """elmo_fast._build_info (TORCH_VERSION, TORCH_CUDA, WITH_CUDA, CUDA_DECISION, CUDA_ARCHS, PYTHON), or None
    when this install has no record (not built, or built before setup.py wrote one)."""
    try:  # generated data, not code: read by name
        return importlib.import_module("elmo_fast._build_info")
    except ImportError:
        return None


def extension_file_exists() -> bool:
    """Whether a compiled elmo_fast._C file is there for this Python (whether or not it loads)."""
    try:
        return importlib.util.find_spec("elmo_fast._C") is not None
    except (ImportError, ValueError):
        return False


def describe_import_failure(exc: BaseException) -> tuple[bool, str]:
    """(whether the extension is there but failed to load, one line saying why and how to fix it)."""
    error = f"{type(exc).__name__}: {exc}"
    if not extension_file_exists():
        return False, error
    info = build_info()
    built = getattr(info, "TORCH_VERSION", None)
    if built is not None and built != torch.__version__:
        return True, (
            f"elmo_fast._C was built against torch {built} but this environment has torch "
            f"{torch.__version__}; it must be rebuilt against torch {torch.__version__}: {REBUILD_HINT}. "
            f"The import error: {error}"
        )
    against = (
        f"built against torch {built}, the torch here"
        if built is not None
        else "no record of the torch it was built against"
    )
    return True, (
        f"elmo_fast._C is installed but does not load ({against}); rebuild it: {REBUILD_HINT}. "
        f"The import error: {error}"
    )


def recorded_cuda_decision() -> str | None:
    """What the build said about the CUDA kernels (e.g. why it skipped them), if it was recorded."""
    return getattr(build_info(), "CUDA_DECISION", None)


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def loaded_against_other_release() -> str | None:
    """The warning to give when elmo_fast._C loaded but was built against another torch release
    (major.minor: torch's C++ ABI is not stable across them, even when the symbols resolve); else None."""
    built = getattr(build_info(), "TORCH_VERSION", None)
    if built is None or _release(built) == _release(torch.__version__):
        return None
    return (
        f"elmo_fast._C was built against torch {built} but runs with torch {torch.__version__}; torch's C++ ABI "
        f"changes between releases, so it may misbehave: rebuild it against torch {torch.__version__}: {REBUILD_HINT}"
    )
