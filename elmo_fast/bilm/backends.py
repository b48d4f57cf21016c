"""Which forward the biLM's stages run: ``"fast"`` (the compiled ops) or ``"reference"`` (plain
PyTorch), and ``"auto"``, the fast one whenever the extension is built."""

from __future__ import annotations

import warnings

import torch

from ..errors import ElmoFastError
from . import ops

BACKENDS = ("auto", "fast", "reference")
_warned_fallback = False


def resolve_backend(backend: str) -> str:
    """ "auto" is "fast" when the extension is built, else "reference" (with a warning, once)."""
    global _warned_fallback
    if backend not in BACKENDS:
        raise ElmoFastError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    has_fast = ops.HAS_EXTENSION and all(hasattr(ops, name) for name in ("char_cnn", "highway", "bilstm"))
    if backend == "fast":
        ops.require_extension()
        if not has_fast:
            raise ElmoFastError(
                "this build of elmo_fast._C lacks the fast-path ops; rebuild it with "
                "`pip install --no-build-isolation -e .`"
            )
    if backend == "auto":
        if has_fast:
            return "fast"
        if not _warned_fallback:
            if ops.EXTENSION_LOAD_FAILED:
                why = f"elmo_fast._C does not load ({ops.EXTENSION_IMPORT_ERROR})"
            else:
                why = (
                    "elmo_fast._C is not built. Build the fast path from the source tree with "
                    "`pip install --no-build-isolation -e .`"
                )
            warnings.warn(
                f"elmo-fast runs its plain-PyTorch reference path (slow): {why}.", RuntimeWarning, stacklevel=3
            )
            _warned_fallback = True
        return "reference"
    return backend


def fast_gradients(device: torch.device | str) -> bool:
    """Whether the fast ops have backward passes on ``device`` (CPU; CUDA once its backward kernels
    are built in)."""
    return ops.HAS_CUDA_BACKWARD if torch.device(device).type == "cuda" else ops.HAS_BACKWARD


def training_backend(backend: str, device: torch.device | str = "cpu") -> str:
    """The backend the training stages run: the fast ops where they have backward passes, else the
    reference stages under autograd."""
    resolved = resolve_backend(backend)
    if resolved == "fast" and not fast_gradients(device):
        return "reference"
    return resolved
