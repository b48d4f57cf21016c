"""Whether elmo_fast._C loaded here, which of its kernels it holds, and what to say when an op needs
what is missing. The facts are read once by :mod:`elmo_fast.bilm.ops` (:func:`load`), which keeps
them as its own names; the messages take them as arguments. What the extension was built against,
and why it does not load, is :mod:`elmo_fast._extension_info`'s."""

from __future__ import annotations

import warnings

import torch

from ._extension_info import describe_import_failure, loaded_against_other_release, recorded_cuda_decision
from .errors import ExtensionNotBuiltError

#: The ops a training step runs besides the forward ones: the backward passes of char_cnn and
#: highway_gate, and the trainable LSTM layer (its forward keeps what its backward reads).
TRAINING_OPS = ("char_cnn_backward", "highway_gate_backward", "lstm_layer_forward", "lstm_layer_backward")


def load() -> tuple[bool, bool, str | None, bool]:
    """Import ``elmo_fast._C`` (its static initializers register the ops): (whether it loaded, whether
    it is there but failed to load, the import error in one line, whether its CUDA kernels were
    compiled in: a build-time fact that says nothing about a GPU). A build that is there but does not
    load, or was built against another torch release, is said once, here, as a warning, since every
    op would then fall back to the slow reference path."""
    try:
        from elmo_fast import _C  # noqa: F401  (imported for its op registrations)
    except ImportError as exc:  # not built, or built against another torch/Python
        load_failed, error = describe_import_failure(exc)
        if load_failed:
            warnings.warn(
                f"elmo-fast's fast path is unavailable, the slow reference path runs instead: {error}",
                RuntimeWarning,
                stacklevel=3,
            )
        return False, load_failed, error, False
    if (other_release := loaded_against_other_release()) is not None:
        warnings.warn(other_release, RuntimeWarning, stacklevel=3)
    return True, False, None, bool(getattr(_C, "WITH_CUDA", 0))


def has_kernels(dispatch_key: str, names: tuple[str, ...] = TRAINING_OPS) -> bool:
    """Whether every op of ``names`` has a kernel for ``dispatch_key`` ("CPU", "CUDA")."""
    return all(torch._C._dispatch_has_kernel_for_dispatch_key(f"elmo_fast::{name}", dispatch_key) for name in names)


def require_extension(has_extension: bool, load_failed: bool, import_error: str | None) -> None:
    """Raise :class:`ExtensionNotBuiltError`, saying how to build it, unless the extension loaded."""
    if not has_extension and load_failed:
        raise ExtensionNotBuiltError(f"the compiled extension elmo_fast._C does not load: {import_error}")
    if not has_extension:
        raise ExtensionNotBuiltError(
            "the compiled extension elmo_fast._C is not available; build it from the source tree with "
            "`pip install --no-build-isolation -e .` (torch must already be installed in this "
            f"environment). Import error: {import_error}"
        )


def cuda_kernels_missing_reason(has_extension: bool, has_cuda_kernels: bool, import_error: str | None) -> str | None:
    """Why this install cannot run the ops on CUDA tensors, with the fix; None when it can."""
    if not has_extension:
        return (
            f"the compiled extension elmo_fast._C is not available ({import_error}); build it with "
            "`pip install --no-build-isolation -e .` from the source tree"
        )
    if has_cuda_kernels:
        return None
    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU-only build, so elmo_fast._C was built without its CUDA "
            "kernels. Install a CUDA build of torch (https://pytorch.org/get-started/locally/), make sure "
            "nvcc is found (CUDA_HOME or PATH), then rebuild from the source tree with "
            "`pip install --no-build-isolation -e .`"
        )
    recorded = recorded_cuda_decision()
    said = f" (the build said: {recorded})" if recorded else ""
    return (
        f"elmo_fast._C was built without its CUDA kernels although torch {torch.__version__} is a CUDA "
        f"{torch.version.cuda} build: the build found no nvcc, or ELMO_FAST_SKIP_CUDA_BUILD=1 was set, or the "
        f"CUDA toolkit was incomplete or of another major version than torch's{said}. Make sure a complete CUDA "
        f"{torch.version.cuda.split('.')[0]}.x toolkit is found (CUDA_HOME, or nvcc on PATH), unset "
        "ELMO_FAST_SKIP_CUDA_BUILD, then rebuild from the source tree with `pip install --no-build-isolation -e .`"
    )
